"""Several envs in one collection on a real spawn-based LocalCluster: each stream collects its
env, each batch's data is that env's, handles and commit records say which, readers select by
it, and envs whose spaces differ fail on the learner before any worker starts."""

from __future__ import annotations

import functools
import re

import gymnasium as gym
import numpy as np
import pytest
import torch

import daskrl
import daskrl.data
from daskrl import EnvSpacesMismatchError
from daskrl.testing import ConstantPolicy, CountingEnv, check_episode_continuity

SHORT = functools.partial(CountingEnv, length=3)


def _daskrl_plugins(client) -> list[str]:
    return sorted(n for names in client.run(lambda dask_worker: list(dask_worker.plugins)).values()
                  for n in names if n.startswith("daskrl-"))


@pytest.mark.timeout(300)
def test_two_counting_envs_each_batch_is_its_envs(client, tmp_path):
    url = str(tmp_path / "s")
    envs = [SHORT, "daskrl.testing:Counting-v0"]  # episodes of 3 and 5 steps, same spaces
    with daskrl.Collector(envs, ConstantPolicy(0, torch.int64), url, client=client,
                          envs_per_worker=2, frames_per_batch=20, total_frames=160,
                          num_workers=4) as collector:
        assert collector.num_streams == 4
        assert [s.env for s in collector.env_specs] == envs
        handles = list(collector)
    assert [h.env for h in handles] == [0, 1, 0, 1] * 2  # stream s collects env s % 2
    store = daskrl.open_store(url)
    records = store.records()
    for h in handles:
        length = (3, 5)[h.env]
        assert h.episode_lengths and set(h.episode_lengths) == {length}, h
        assert records[h.batch_id]["env"] == h.env
        assert records[h.batch_id]["stream"] % 2 == h.env
        data = h.load()
        # The env's own transitions: [episode, t] -> [episode, t + 1], ending at its length.
        np.testing.assert_array_equal(data["observation"][..., 1].numpy(), data["step"].numpy())
        np.testing.assert_array_equal(data["terminated"].numpy(),
                                      (data["step"] == length - 1).numpy())
    assert check_episode_continuity(store).batches == 8  # raises on any break
    # Readers select by index or by the label the run's settings give.
    settings = store.runs()[0]["settings"]
    assert settings["envs"] == settings["env"] == ["daskrl.testing.CountingEnv",
                                                   "daskrl.testing:Counting-v0"]
    ids = {e: [h.batch_id for h in handles if h.env == e] for e in (0, 1)}
    assert [h.batch_id for h in store.handles(env=0)] == ids[0]
    assert [h.batch_id for h in store.handles(env="daskrl.testing:Counting-v0")] == ids[1]
    assert [h.env for h in store.handles(env=0)] == [0, 0, 0, 0]
    assert [h.batch_id for h, _ in store.iter_batches(["reward"], env=1)] == ids[1]
    assert len(store.handles(env=[0, 1])) == 8 and store.handles(env=2) == []
    for e, length in ((0, 3), (1, 5)):
        episodes = list(daskrl.data.episodes(store, env=e))
        assert episodes and {ep.length for ep in episodes} == {length}
        assert {b for ep in episodes for b in ep.batch_ids} <= set(ids[e])
    # A Minari dataset holds one env: a run of several is refused, naming it.
    from daskrl.integrations.minari import export_minari

    with pytest.raises(daskrl.ConfigError, match=re.escape(
            f"run 0 of {store.url!r} collected several envs (['daskrl.testing.CountingEnv', ")):
        export_minari(store, "counting/two-v0", data_path=tmp_path / "minari")
    assert not (tmp_path / "minari").exists()


@pytest.mark.timeout(300)
def test_cartpoles_with_other_limits_and_a_default_stream_count(client, tmp_path):
    url = str(tmp_path / "s")
    short = functools.partial(gym.make, "CartPole-v1", max_episode_steps=4)
    policy = ConstantPolicy(0, torch.int64)  # always left: CartPole falls after ~9-10 steps
    with daskrl.Collector(["CartPole-v1", short], policy, url, client=client, envs_per_worker=2,
                          frames_per_batch=40, total_frames=160) as collector:
        assert collector.num_streams == 2  # two workers, two envs
        handles = list(collector)
    assert [h.env for h in handles] == [0, 1, 0, 1]
    long_eps = [n for h in handles if h.env == 0 for n in h.episode_lengths]
    short_eps = [n for h in handles if h.env == 1 for n in h.episode_lengths]
    assert short_eps and set(short_eps) == {4}
    assert long_eps and min(long_eps) > 4
    for h in daskrl.open_store(url).handles(env=1):
        data = h.load(keys=["step", "truncated", "terminated"])
        assert int(data["step"].max()) == 3
        np.testing.assert_array_equal(data["truncated"].numpy(), (data["step"] == 3).numpy())


@pytest.mark.timeout(300)
def test_envs_whose_spaces_differ_fail_before_workers_start(client, tmp_path):
    url = tmp_path / "s"
    with pytest.raises(EnvSpacesMismatchError, match=re.escape(
            "the envs of this collection must have the same spaces, but env 0 ('CartPole-v1') "
            "has the observation space Box(")) as info:
        daskrl.Collector(["CartPole-v1", "daskrl.testing:Counting-v0"],
                         ConstantPolicy(0, torch.int64), str(url), client=client)
    assert "and env 1 ('daskrl.testing:Counting-v0') has Box(-inf, inf, (2,), float32)" in str(
        info.value)
    assert _daskrl_plugins(client) == [] and not url.exists()  # no worker, no store touched
    with pytest.raises(daskrl.ConfigError, match="num_workers=3 is not a multiple of the 2 envs"):
        daskrl.Collector(["CartPole-v1", "CartPole-v1"], ConstantPolicy(0, torch.int64),
                         str(url), client=client, num_workers=3)
    assert _daskrl_plugins(client) == [] and not url.exists()
