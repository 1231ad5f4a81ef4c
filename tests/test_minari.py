"""The Minari export (``daskrl.integrations.minari``, ``daskrl export --minari``, run in this
process: ``tests/cli_inprocess.py``): real collections on a LocalCluster, exported, read back
with Minari and compared, episode by episode and value by value, with the store's own
episodes."""

from __future__ import annotations

import functools
import json
import os
import shutil
import warnings

import gymnasium as gym
import minari
import numpy as np
import pytest
from cli_inprocess import daskrl_main
from distributed import Client

import daskrl
import daskrl.data
from daskrl.integrations import minari as export_module
from daskrl.integrations.minari import export_minari
from daskrl.policies import MLPPolicy
from daskrl.store._layout import run_of

pytestmark = pytest.mark.timeout(300)

CARTPOLE_LIMIT = 15  # run 1's max_frames_per_traj: its episodes end truncated
PENDULUM_LIMIT = 30  # run 2's


def _policy(env_id: str) -> MLPPolicy:
    env = gym.make(env_id)
    return MLPPolicy(env.observation_space, env.action_space)


@pytest.fixture(scope="module")
def store_url(cluster, tmp_path_factory):
    """Four runs in one store: CartPole (episodes spanning batches, some cut at the end),
    CartPole truncated at 15 steps, Pendulum (Box actions) truncated at 30, and CartPole made
    by a factory (the run records the factory's name, not an id)."""
    url = str(tmp_path_factory.mktemp("minari") / "store")
    runs = [
        ("CartPole-v1", "CartPole-v1", dict(frames_per_batch=64, total_frames=512)),
        ("CartPole-v1", "CartPole-v1", dict(frames_per_batch=40, total_frames=240,
                                            max_frames_per_traj=CARTPOLE_LIMIT)),
        ("Pendulum-v1", "Pendulum-v1", dict(frames_per_batch=40, total_frames=400,
                                            max_frames_per_traj=PENDULUM_LIMIT)),
        (functools.partial(gym.make, "CartPole-v1"), "CartPole-v1",
         dict(frames_per_batch=32, total_frames=128)),
    ]
    with Client(cluster, set_as_default=False) as client:
        for env, env_id, options in runs:
            with daskrl.Collector(env, _policy(env_id), url, client=client, envs_per_worker=2,
                                  num_workers=1, **options) as c:
                list(c)
    return url


def _store_episodes(url, runs):
    return [e for e in daskrl.data.episodes(daskrl.open_store(url), complete_only=False)
            if run_of(e.batch_ids[0]) in runs]


def _meta(dataset):
    return list(dataset.storage.get_episode_metadata(range(dataset.total_episodes)))


def _assert_same(got, ep, *, cut=False):
    """A Minari episode against the store's episode it came from, exactly."""
    d = {k: v.numpy() for k, v in ep.data.items()}
    L = ep.length
    assert len(got) == L and got.observations.shape == (L + 1, *d["observation"].shape[1:])
    for name, mine, theirs in [
        ("observations[:-1]", got.observations[:-1], d["observation"]),
        ("observations[1:]", got.observations[1:], d["next_observation"]),  # the final one too
        ("actions", got.actions, d["action"]),
        ("rewards", got.rewards, d["reward"]),
        ("terminations", got.terminations, d["terminated"]),
        ("truncations[:-1]", got.truncations[:-1], d["truncated"][:-1]),
    ]:
        assert mine.dtype == theirs.dtype, (name, mine.dtype, theirs.dtype)
        assert np.array_equal(mine, theirs), (ep.episode_id, name)
    assert bool(got.truncations[-1]) == (True if cut else bool(d["truncated"][-1]))
    assert got.terminations[-1] or got.truncations[-1]  # every exported episode ends
    assert got.infos == {}


def test_cartpole_runs_round_trip_through_minari(store_url, tmp_path, monkeypatch):
    r = export_minari(store_url, "cartpole/daskrl-v0", runs=[0, 1], data_path=tmp_path)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    dataset = minari.load_dataset("cartpole/daskrl-v0")

    everything = _store_episodes(store_url, {0, 1})
    whole = [e for e in everything if e.complete]
    assert r.runs == (0, 1) and r.path == str(tmp_path / "cartpole" / "daskrl-v0")
    assert r.episodes == dataset.total_episodes == len(whole) > 10
    assert r.steps == dataset.total_steps == sum(e.length for e in whole)
    assert r.cut_dropped == len(everything) - len(whole) >= 1  # at most 2 streams x 2 runs
    assert r.cut_truncated == r.partial_skipped == 0
    # In the order the episodes ended, each traced back to its daskrl episode.
    meta = _meta(dataset)
    assert [int(m["daskrl_episode_id"]) for m in meta] == [e.episode_id for e in whole]
    for got, ep, m in zip(dataset.iterate_episodes(), whole, meta):
        _assert_same(got, ep)
        assert tuple(m["daskrl_batch_ids"]) == ep.batch_ids and not m["daskrl_cut"]
        assert int(m["daskrl_run"]) == run_of(ep.batch_ids[0])
    assert any(len(ep.batch_ids) > 1 for ep in whole)  # episodes across batches
    ends = [(bool(e.data["terminated"][-1]), bool(e.data["truncated"][-1])) for e in whole]
    assert (True, False) in ends and (False, True) in ends  # run 1 truncates at 15 steps

    spec = dataset.spec
    assert spec.env_spec.id == "CartPole-v1"
    assert spec.env_spec.max_episode_steps == 500  # the longer of the runs' limits
    env = dataset.recover_environment()
    assert env.observation_space == spec.observation_space == gym.make("CartPole-v1").observation_space
    assert spec.action_space == gym.spaces.Discrete(2)
    assert "run(s) 0, 1" in dataset.storage.metadata["description"]
    # Minari's own sampling reads it.
    assert sum(len(e) for e in dataset.sample_episodes(3)) > 0


def test_pendulum_box_actions_and_cut_episodes_exported_as_truncated(store_url, tmp_path):
    r = export_minari(store_url, "pendulum/daskrl-v1", runs=2, data_path=tmp_path,
                      cut="truncate")
    dataset = r.load()
    everything = _store_episodes(store_url, {2})
    cut = [e for e in everything if not e.complete]
    # 2 streams of 200 steps: 6 episodes of 30 each, and a cut one of 20 steps.
    assert len(everything) == 14 and len(cut) == 2 and all(e.length == 20 for e in cut)
    assert (r.episodes, r.steps, r.cut_truncated, r.cut_dropped) == (14, 400, 2, 0)
    meta = _meta(dataset)
    assert sorted(int(m["daskrl_episode_id"]) for m in meta) == sorted(
        e.episode_id for e in everything)
    by_id = {e.episode_id: e for e in everything}
    for got, m in zip(dataset.iterate_episodes(), meta):
        ep = by_id[int(m["daskrl_episode_id"])]
        _assert_same(got, ep, cut=not ep.complete)
        assert bool(m["daskrl_cut"]) == (not ep.complete)
        assert got.actions.shape == (ep.length, 1) and got.actions.dtype == np.float32
        if not ep.complete:  # the store says it was still running; the export, truncated
            assert not ep.data["truncated"][-1] and got.truncations[-1]
    assert dataset.spec.env_spec.max_episode_steps == PENDULUM_LIMIT
    assert dataset.recover_environment().spec.max_episode_steps == PENDULUM_LIMIT
    assert dataset.spec.action_space == gym.make("Pendulum-v1").action_space
    assert "2 episodes were still running" in dataset.storage.metadata["description"]


def test_an_existing_dataset_is_refused_unless_overwritten(store_url, tmp_path):
    first = export_minari(store_url, "cartpole/exists-v0", runs=0, data_path=tmp_path)
    with pytest.raises(daskrl.ExportExistsError, match=r"already exists.*--overwrite") as info:
        export_minari(store_url, "cartpole/exists-v0", runs=1, data_path=tmp_path)
    assert isinstance(info.value, FileExistsError)
    assert first.load().total_episodes == first.episodes  # untouched
    second = export_minari(store_url, "cartpole/exists-v0", runs=1, data_path=tmp_path,
                           overwrite=True)
    dataset = second.load()
    assert dataset.total_episodes == second.episodes
    assert {int(m["daskrl_run"]) for m in _meta(dataset)} == {1}
    assert sorted(os.listdir(tmp_path / "cartpole")) == [  # no copy set aside remains
        "exists-v0", "namespace_metadata.json"]


def test_a_failed_export_leaves_no_dataset_and_restores_the_one_it_replaced(
        store_url, tmp_path, monkeypatch):
    old = export_minari(store_url, "cartpole/broken-v0", runs=1, data_path=tmp_path)
    damaged = tmp_path / "store"
    shutil.copytree(store_url, damaged)
    store = daskrl.open_store(str(damaged))
    last = max(b for b in store.batch_ids() if run_of(b) == 0)
    os.remove(damaged / store.records()[last]["path"])  # a committed batch's data is gone
    monkeypatch.setattr(export_module, "_CHUNK_BYTES", 1)  # written episode by episode
    for overwrite in (False, True):
        name = "cartpole/broken-v0" if overwrite else "cartpole/new-v0"
        with pytest.raises(daskrl.BatchDataMissingError):
            export_minari(str(damaged), name, runs=0, data_path=tmp_path, overwrite=overwrite)
    assert sorted(os.listdir(tmp_path / "cartpole")) == ["broken-v0", "namespace_metadata.json"]
    restored = minari.MinariDataset(tmp_path / "cartpole" / "broken-v0" / "data")
    assert restored.total_episodes == old.episodes
    assert {int(m["daskrl_run"]) for m in _meta(restored)} == {1}


def test_episodes_with_deleted_batches_are_left_out(store_url, tmp_path):
    copy = tmp_path / "store"
    shutil.copytree(store_url, copy)
    store = daskrl.open_store(str(copy), writable=True)
    run0 = [b for b in store.batch_ids() if run_of(b) == 0]
    store.delete_batches([run0[len(run0) // 2]])
    everything = _store_episodes(str(copy), {0})
    holed = [e for e in everything
             if not np.array_equal(e.data["step"].numpy(), np.arange(e.length))]
    whole = [e for e in everything if e.complete]
    assert holed
    r = export_minari(str(copy), "cartpole/holes-v0", runs=0, data_path=tmp_path / "d")
    assert r.partial_skipped == len(holed) and r.episodes == len(whole)
    dataset = r.load()
    for got, ep in zip(dataset.iterate_episodes(), whole, strict=True):
        _assert_same(got, ep)


def test_runs_of_several_envs_or_a_factory_need_to_be_named(store_url, tmp_path):
    with pytest.raises(daskrl.ConfigError, match=r"different envs.*Pendulum-v1.*--run N"):
        export_minari(store_url, "mixed-v0", data_path=tmp_path)
    with pytest.raises(daskrl.ConfigError, match=r"no run \[7\]; its runs are \[0, 1, 2, 3\]"):
        export_minari(store_url, "seven-v0", runs=7, data_path=tmp_path)
    with pytest.raises(daskrl.ConfigError, match=r"gymnasium\.envs\.registration\.make.*--env ID"):
        export_minari(store_url, "factory-v0", runs=3, data_path=tmp_path)
    with pytest.raises(daskrl.ConfigError, match=r"does not fit the env's spaces.*float32\[4\]"):
        export_minari(store_url, "wrong-v0", runs=0, data_path=tmp_path, env="Pendulum-v1")
    with pytest.raises(daskrl.ConfigError, match="not a Minari dataset id"):
        export_minari(store_url, "no-version", runs=0, data_path=tmp_path)
    assert not os.listdir(tmp_path)  # nothing written for any of them
    r = export_minari(store_url, "factory-v0", runs=3, data_path=tmp_path, env="CartPole-v1")
    assert r.load().spec.env_spec.id == "CartPole-v1"
    whole = [e for e in _store_episodes(store_url, {3}) if e.complete]
    for got, ep in zip(r.load().iterate_episodes(), whole, strict=True):
        _assert_same(got, ep)


def test_cli_export_writes_a_dataset_minari_loads(store_url, tmp_path, monkeypatch):
    data = tmp_path / "datasets"
    cmd = ["export", store_url, "--minari", "cartpole/cli-v0", "--run", "0", "--run", "1",
           "--author", "Ada", "--json"]
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(data))  # the default root
    with warnings.catch_warnings(record=True) as caught:  # every warning, as a process shows
        warnings.simplefilter("always")
        out = daskrl_main(*cmd)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["path"] == str(data / "cartpole" / "cli-v0") and report["runs"] == [0, 1]
    dataset = minari.MinariDataset(data / "cartpole" / "cli-v0" / "data")
    everything = _store_episodes(store_url, {0, 1})
    whole = [e for e in everything if e.complete]
    cut = len(everything) - len(whole)
    assert report["episodes"] == dataset.total_episodes == len(whole)
    for got, ep in zip(dataset.iterate_episodes(), whole, strict=True):
        _assert_same(got, ep)
    assert dataset.storage.metadata["author"] == {"Ada"}
    # Minari's nags about unset metadata stay quiet
    assert not [w for w in caught if issubclass(w.category, UserWarning)], caught
    assert "UserWarning" not in out.stderr

    again = daskrl_main(*cmd[:-1])
    assert again.returncode == 3 and again.stdout == ""
    assert again.stderr.startswith("daskrl: error: a Minari dataset 'cartpole/cli-v0' "
                                   "already exists"), again.stderr
    # Replacing it, the directory given as --data-path instead of by MINARI_DATASETS_PATH.
    monkeypatch.delenv("MINARI_DATASETS_PATH")
    replaced = daskrl_main(*cmd[:-1], "--overwrite", "--data-path", str(data), "--cut",
                           "truncate")
    text = replaced.stdout
    assert replaced.returncode == 0, replaced.stderr
    assert (f"exported {len(everything)} episodes" in text
            and f"{cut} episodes still running when the collection stopped end truncated"
            in text), text
    assert minari.MinariDataset(data / "cartpole" / "cli-v0" / "data").total_episodes == len(
        everything)
