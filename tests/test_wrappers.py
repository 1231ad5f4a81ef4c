"""Wrappers given as specs, on a real spawn-based LocalCluster and through ``daskrl collect`` (in
this process, on the session's cluster): what the store holds is what the wrapped env gives
(episode limits, stacked frames), the run record names the wrappers, and a bad wrapper fails on
the learner before any worker works."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from cli_inprocess import daskrl_main

import daskrl
import daskrl.data
from daskrl import WrapperError
from daskrl.testing import ConstantPolicy

FRAME_STACK = "gymnasium.wrappers.FrameStackObservation"
TIME_LIMIT = "gymnasium.wrappers.TimeLimit"
STATS = "gymnasium.wrappers.RecordEpisodeStatistics"


def _daskrl_plugins(client) -> list[str]:
    return sorted(n for names in client.run(lambda dask_worker: list(dask_worker.plugins)).values()
                  for n in names if n.startswith("daskrl-"))


def check_stacked_counting(data: dict[str, torch.Tensor], stack: int) -> None:
    """Each stored observation of a stacked ``CountingEnv`` is the last ``stack`` observations
    ``[episode, t]`` of the unwrapped env (the first repeated before the episode's step
    ``stack - 1``), and ``next_observation`` is that stack one step on."""
    obs, nxt, step = data["observation"].numpy(), data["next_observation"].numpy(), data["step"]
    T, E = step.shape
    assert obs.shape == nxt.shape == (T, E, stack, 2)
    t = step.numpy()[..., None]
    lag = np.arange(stack - 1, -1, -1)  # frame k of the stack is `stack - 1 - k` steps back
    np.testing.assert_array_equal(obs[..., 1], np.maximum(t - lag, 0))
    np.testing.assert_array_equal(nxt[..., 1], np.maximum(t + 1 - lag, 0))
    episode = obs[..., -1, 0]
    np.testing.assert_array_equal(obs[..., 0], np.repeat(episode[..., None], stack, -1))
    np.testing.assert_array_equal(nxt[..., 0], obs[..., 0])
    # Episodes of one env follow each other: 0, 1, 2, ... (no junk reset transition stored).
    for e in range(E):
        firsts = episode[:, e][np.r_[True, np.diff(data["episode_id"][:, e].numpy()) != 0]]
        np.testing.assert_array_equal(np.diff(firsts), 1)


@pytest.mark.timeout(300)
def test_wrappers_shape_the_stored_data_and_are_recorded(client, tmp_path):
    url = str(tmp_path / "s")
    wrappers = [f"{TIME_LIMIT}:max_episode_steps=7", f"{FRAME_STACK}: stack_size=3", STATS]
    with daskrl.Collector("daskrl.testing:Counting-v0", ConstantPolicy(0, torch.int64), url,
                          client=client, env_kwargs={"length": 10}, envs_per_worker=2,
                          frames_per_batch=24, total_frames=96, wrappers=wrappers) as collector:
        assert collector.observation_space.shape == (3, 2)  # the learner probed the wrapped env
        handles = list(collector)
    assert len(handles) == 4
    lengths = [n for h in handles for n in h.episode_lengths]
    assert lengths and set(lengths) == {7}  # TimeLimit(7) cut every 10-step episode
    store = daskrl.open_store(url)
    for h in handles:
        data = h.load()
        check_stacked_counting(data, 3)
        assert not data["terminated"].any()
        np.testing.assert_array_equal(data["truncated"].numpy(), (data["step"] == 6).numpy())
    episodes = list(daskrl.data.episodes(store))
    assert episodes and {e.length for e in episodes} == {7}
    settings = store.runs()[0]["settings"]
    assert settings["wrappers"] == [f"{TIME_LIMIT}:max_episode_steps=7",
                                    f"{FRAME_STACK}:stack_size=3", STATS]
    assert settings["observation_space"] == "Box(-inf, inf, (3, 2), float32)"


@pytest.mark.timeout(300)
def test_a_bad_wrapper_fails_on_the_learner_before_workers_start(client, tmp_path):
    url = str(tmp_path / "s")
    policy = ConstantPolicy(0, torch.int64)
    for spec, message in [
        (f"{FRAME_STACK}:stack_size=three", "the value of 'stack_size' ('three') is not a "
                                            "Python literal"),
        ("gymnasium.wrappers.FrameStack", "'gymnasium.wrappers' has no attribute 'FrameStack'"),
        (TIME_LIMIT, f"wrapper '{TIME_LIMIT}' failed on env 'CartPole-v1': TypeError: "),
    ]:
        with pytest.raises(WrapperError, match=re.escape(message)):
            daskrl.Collector("CartPole-v1", policy, url, client=client, wrappers=[spec])
        assert _daskrl_plugins(client) == []  # no worker got anything
    with pytest.raises(daskrl.ResumeMismatchError, match="wrappers differs"):
        with daskrl.Collector("CartPole-v1", policy, url, client=client, envs_per_worker=2,
                              frames_per_batch=8, total_frames=16,
                              wrappers=[f"{TIME_LIMIT}:max_episode_steps=3"]) as c:
            c.close()  # a run with the wrapper, interrupted at once
        daskrl.Collector("CartPole-v1", policy, url, client=client, envs_per_worker=2,
                         frames_per_batch=8, total_frames=16, resume=True)
    assert _daskrl_plugins(client) == []


@pytest.mark.timeout(400)
def test_cli_wrappers_and_several_envs_reach_the_store(cluster, tmp_path):
    store = tmp_path / "cli"
    out = daskrl_main("collect", "--store", str(store),
                      "--env", "daskrl.testing:CountingEnv", "--env", "daskrl.testing:SlowEnv",
                      "--wrapper", f"{TIME_LIMIT}:max_episode_steps=6",
                      "--wrapper", f"{FRAME_STACK}:stack_size=3", "--wrapper", STATS,
                      "--workers", "2", "--envs-per-worker", "2", "--frames-per-batch", "24",
                      "--frames", "96", "--scheduler", cluster.scheduler_address, "--json",
                      cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["frames"] == 96
    s = daskrl.open_store(str(store))
    settings = s.runs()[0]["settings"]
    assert settings["envs"] == ["daskrl.testing:CountingEnv", "daskrl.testing:SlowEnv"]
    assert settings["wrappers"] == [f"{TIME_LIMIT}:max_episode_steps=6",
                                    f"{FRAME_STACK}:stack_size=3", STATS]
    # CountingEnv ends its episodes after 5 steps; SlowEnv would after 7: TimeLimit cuts at 6.
    for env, length, ended_by in [(0, 5, "terminated"), (1, 6, "truncated")]:
        handles = s.handles(env=env)
        assert len(handles) == 2 and all(h.env == env for h in handles)
        assert {n for h in handles for n in h.episode_lengths} == {length}
        for h in handles:
            data = h.load()
            check_stacked_counting(data, 3)
            np.testing.assert_array_equal(data[ended_by].numpy(),
                                          (data["step"] == length - 1).numpy())
    assert s.handles(env="daskrl.testing:SlowEnv") == s.handles(env=1)


def test_cli_bad_wrappers_exit_3_before_any_cluster(tmp_path):
    base = ["collect", "--env", "CartPole-v1", "--store", str(tmp_path / "s"), "--no-progress"]
    for spec, message in [
        ("gymnasium.wrappers.NoSuch", "daskrl: error: wrapper 'gymnasium.wrappers.NoSuch': "
                                      "'gymnasium.wrappers' has no attribute 'NoSuch'"),
        (f"{FRAME_STACK}:stack_size", f"daskrl: error: wrapper spec '{FRAME_STACK}:stack_size': "
                                      "'stack_size' is not KEY=VALUE pairs"),
        (TIME_LIMIT, f"daskrl: error: wrapper '{TIME_LIMIT}' failed on env 'CartPole-v1'"),
    ]:
        out = daskrl_main(*base, "--wrapper", spec)
        assert out.returncode == 3, out.stderr
        assert message in out.stderr, out.stderr
    assert not (tmp_path / "s").exists()  # nothing was started, not even the store
