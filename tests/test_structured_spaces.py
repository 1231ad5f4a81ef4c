"""Dict and Tuple spaces end to end on a real LocalCluster (spawned worker processes): a
goal-conditioned env with a Dict observation and action space and an env with Tuple spaces
collected, their batches loaded back nested with every value as the env made it, the true
final next_observation at episode ends, episodes across batches, zarr alone, TensorDict and
dataset views, and the CLI's default policy on a Dict observation space (``daskrl collect`` in
this process, on the session's cluster)."""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
import torch
import zarr
from cli_inprocess import daskrl_main
from distributed import Client
from zarr.storage import ZipStore

import daskrl
import daskrl.data
from daskrl.testing import (
    GoalCountingEnv,
    SpacePolicy,
    TagPolicy,
    TupleCountingEnv,
    check_episode_continuity,
)

pytestmark = pytest.mark.timeout(300)

LENGTH = 5  # episodes of 5 steps; batches of 7 steps x 3 envs: episodes span batches


@pytest.fixture(scope="module")
def goal_store(cluster, tmp_path_factory):
    """Batches of the session's cluster (two spawned worker processes)."""
    url = str(tmp_path_factory.mktemp("goal") / "store")
    env = GoalCountingEnv(LENGTH, dict_actions=True)
    make = functools.partial(GoalCountingEnv, LENGTH, dict_actions=True)
    with (Client(cluster, set_as_default=False) as client,
          daskrl.Collector(make, SpacePolicy(env.action_space), url, client=client,
                           envs_per_worker=3, frames_per_batch=21, total_frames=21 * 6,
                           num_workers=2, init_random_frames=6) as c):
        handles = list(c)
    return url, handles


def test_dict_batches_round_trip_with_every_value_real(goal_store):
    url, handles = goal_store
    store = daskrl.open_store(url)
    assert len(handles) == 6 and store.frames == 126
    for h in handles:
        b = h.load()
        obs, nxt, act = b["observation"], b["next_observation"], b["action"]
        assert isinstance(obs, dict) and sorted(obs) == [
            "achieved_goal", "desired_goal", "last_force", "observation", "phase"]
        assert sorted(act) == ["force", "step"]
        assert obs["phase"].dtype == torch.int64 and obs["observation"].dtype == torch.float32
        assert obs["observation"].shape == (7, 3, 2) and act["force"].shape == (7, 3, 2)
        assert torch.equal(nxt["observation"], obs["observation"] + torch.tensor([0.0, 1.0]))
        assert torch.equal(nxt["achieved_goal"][..., 0], nxt["observation"][..., 1])
        assert torch.equal(nxt["phase"], nxt["observation"][..., 1].long())
        assert (obs["desired_goal"] == LENGTH).all() and (nxt["desired_goal"] == LENGTH).all()
        # the true final observation at an episode's end, never the reset one
        ends = b["terminated"]
        assert torch.equal(ends, nxt["observation"][..., 1] == LENGTH)
        assert (nxt["observation"][..., 1][ends] == LENGTH).all()
        assert torch.equal(b["step"], obs["observation"][..., 1].long())
        # what the env received is the stored action, clipped to its bounds
        assert torch.equal(nxt["last_force"], act["force"].clamp(-1, 1))
        assert torch.equal(b["reward"], nxt["observation"][..., 1])
    # the first 6 frames (2 steps of 3 envs) are random samples of the Dict action space
    first = store.load(min(store.batch_ids()))
    assert (first["action"]["force"][:2].abs() <= 1).all()
    assert check_episode_continuity(store).ended > 0


def test_dict_episodes_across_batches(goal_store):
    url, _ = goal_store
    store = daskrl.open_store(url)
    episodes = list(daskrl.data.episodes(store))
    assert len(episodes) >= 12 and any(len(e.batch_ids) > 1 for e in episodes)
    for ep in episodes:
        o = ep.data["observation"]["observation"]
        assert ep.complete and ep.length == LENGTH
        assert o[:, 1].tolist() == list(range(LENGTH)) and (o[:, 0] == o[0, 0]).all()
        assert ep.data["next_observation"]["observation"][-1, 1] == LENGTH
        assert ep.data["action"]["force"].shape == (LENGTH, 2)
        assert ep.total_reward == sum(range(1, LENGTH + 1))
    only = next(daskrl.data.episodes(store, ["observation/phase"]))
    assert set(only.data) >= {"observation", "episode_id"}
    assert list(only.data["observation"]) == ["phase"]


def test_dict_batches_read_with_zarr_alone_and_as_views(goal_store):
    url, handles = goal_store
    h = handles[0]
    batch = h.load()
    with ZipStore(os.path.join(url, h.path), mode="r") as container:
        group = zarr.open_group(container, mode="r")
        for key in ("observation", "next_observation"):
            for name, arr in group[key].arrays():
                assert np.array_equal(arr[...], batch[key][name].numpy()), (key, name)
        assert np.array_equal(group["action/force"][...], batch["action"]["force"].numpy())
        assert group.attrs["batch_id"] == h.batch_id
    from daskrl.integrations.torchrl import to_tensordict

    td = to_tensordict(h.load())
    assert td.batch_size == torch.Size([7, 3])
    assert torch.equal(td["observation", "desired_goal"], batch["observation"]["desired_goal"])
    from daskrl.integrations.torchrl import to_torchrl

    trl = to_torchrl(batch)
    assert torch.equal(trl["next", "observation", "phase"], batch["next_observation"]["phase"])
    item = daskrl.TransitionDataset(url)[0]
    assert item["observation"]["observation"].shape == (2,) and item["action"]["step"].shape == ()
    flat = daskrl.data.to_dask(daskrl.open_store(url), keys=["observation", "reward"])
    assert sorted(flat) == ["observation/achieved_goal", "observation/desired_goal",
                            "observation/last_force", "observation/observation",
                            "observation/phase", "reward"]


def test_tuple_spaces_round_trip(client, tmp_path):
    url = str(tmp_path / "store")
    env = TupleCountingEnv(3)
    with daskrl.Collector(functools.partial(TupleCountingEnv, 3), SpacePolicy(env.action_space), url,
                          client=client, envs_per_worker=2, frames_per_batch=8,
                          total_frames=32, num_workers=2) as c:
        handles = list(c)
    store = daskrl.open_store(url)
    for h in handles:
        b = h.load()
        obs, nxt = b["observation"], b["next_observation"]
        assert isinstance(obs, tuple) and len(obs) == 3 and isinstance(b["action"], tuple)
        assert obs[2].dtype == torch.int8 and obs[1].dtype == torch.int64
        assert torch.equal(nxt[0], obs[0] + torch.tensor([0.0, 1.0]))
        t = nxt[0][..., 1].long()
        assert torch.equal(nxt[1], t)
        assert torch.equal(nxt[2], torch.stack([(t >> k) & 1 for k in range(3)], -1).to(torch.int8))
        assert torch.equal(b["terminated"], t == 3)
    eps = list(daskrl.data.episodes(store))
    assert eps and all(e.length == 3 and isinstance(e.data["observation"], tuple) for e in eps)
    report = check_episode_continuity(store)
    assert report.transitions == 32 and report.ended == len(eps)
    part = store.load(handles[0].batch_id, keys=["observation/2"])
    assert list(part["observation"]) == ["2"]  # a part of a tuple comes keyed by its index


def test_cli_collects_a_dict_env_with_its_default_policy(cluster, tmp_path):
    store = tmp_path / "demo"
    out = daskrl_main("collect", "--env", "daskrl.testing:GoalCounting-v0", "--frames", "64",
                      "--frames-per-batch", "32", "--envs-per-worker", "4", "--workers", "1",
                      "--store", str(store), "--no-progress", "--scheduler",
                      cluster.scheduler_address, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    s = daskrl.open_store(str(store))
    b = s.load(s.batch_ids()[0])
    assert s.frames == 64 and b["action"].dtype == torch.int64 and "log_prob" in b
    assert torch.equal(b["next_observation"]["observation"],
                       b["observation"]["observation"] + torch.tensor([0.0, 1.0]))
    assert "Dict(" in s.runs()[0]["settings"]["observation_space"]


def test_dict_observations_export_to_minari(client, tmp_path, monkeypatch):
    minari = pytest.importorskip("minari")  # the daskrl[minari] extra (CI installs it)
    from daskrl.integrations.minari import export_minari

    url = str(tmp_path / "store")
    with daskrl.Collector("daskrl.testing:GoalCounting-v0", TagPolicy(), url, client=client,
                          envs_per_worker=2, frames_per_batch=12, total_frames=24,
                          num_workers=1) as c:
        list(c)
    r = export_minari(url, "goal/daskrl-v0", data_path=tmp_path / "d")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "d"))
    dataset = minari.load_dataset("goal/daskrl-v0")
    episodes = list(daskrl.data.episodes(daskrl.open_store(url)))
    assert r.episodes == dataset.total_episodes == len(episodes) == 4
    for got, ep in zip(dataset.iterate_episodes(), episodes):
        for key in ("observation", "achieved_goal", "desired_goal", "phase"):
            want = torch.cat([ep.data["observation"][key],
                              ep.data["next_observation"][key][-1:]]).numpy()
            assert np.array_equal(got.observations[key], want), key
        assert np.array_equal(got.actions, ep.data["action"].numpy())
    assert dataset.spec.observation_space == GoalCountingEnv().observation_space
