"""MuJoCo's HalfCheetah-v5 (the ``mujoco`` extra), on an in-process LocalCluster and through
``daskrl collect`` (run in this process, on its embedded process cluster): continuous actions,
float64 observations (float32 through a wrapper), every stored row compared byte for byte with
what the same seeded env returns when the test re-steps it with the recorded actions."""

from __future__ import annotations

import json

import gymnasium as gym
import mujoco  # the mujoco extra (in the test extra: pip install -e ".[test]")
import numpy as np
import pytest
from cli_inprocess import daskrl_main
from env_replay import replay, stream_data

import daskrl
from daskrl.policies import MLPPolicy
from daskrl.testing import check_episode_continuity

ENV = "HalfCheetah-v5"
LOW, HIGH = -1.0, 1.0  # HalfCheetah's action bounds
assert mujoco.__version__


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path, monkeypatch):
    """MuJoCo 4 logs gymnasium's HalfCheetah model's deprecated 'settotalmass' to
    MUJOCO_LOG.TXT in the working directory of each process that builds the env: the test's
    (its in-process workers and the envs it re-steps) and the CLI's (the embedded cluster's
    worker processes start in the command's working directory) are tmp_path."""
    monkeypatch.chdir(tmp_path)


def make_cheetah(max_episode_steps: int, dtype: type | None = None) -> gym.Env:
    """The env as the test builds it, with gymnasium alone (not daskrl's code)."""
    env = gym.make(ENV)
    if dtype is not None:
        env = gym.wrappers.DtypeObservation(env, dtype)
    return gym.wrappers.TimeLimit(env, max_episode_steps=max_episode_steps)


def check_cheetah_store(url: str, frames: int, n_envs: int, limit: int,
                        dtype: np.dtype) -> dict[str, np.ndarray]:
    store = daskrl.open_store(url)
    assert store.frames == frames
    check_episode_continuity(store)
    d = stream_data(url)
    T = frames // n_envs
    assert d["observation"].shape == d["next_observation"].shape == (T, n_envs, 17)
    assert d["observation"].dtype == d["next_observation"].dtype == dtype
    assert d["action"].shape == (T, n_envs, 6) and d["action"].dtype == np.float32
    assert d["reward"].dtype == np.float32  # the store's reward dtype (docs/store-format.md)
    ended = d["terminated"] | d["truncated"]
    assert not d["terminated"].any() and (d["step"][ended] == limit - 1).all()
    assert ended.sum() >= n_envs
    same = ~ended[:-1]
    np.testing.assert_array_equal(d["observation"][1:][same], d["next_observation"][:-1][same])
    return d


@pytest.mark.timeout(400)
def test_halfcheetah_float64_round_trip_and_actions_in_bounds(inproc_client, tmp_path):
    client = inproc_client  # in-process workers: in tmp_path too
    url = str(tmp_path / "cheetah")
    seed, n_envs, limit, random_frames = 11, 2, 25, 40
    probe = gym.make(ENV)
    assert probe.observation_space.dtype == np.float64
    policy = MLPPolicy(probe.observation_space, probe.action_space)
    with daskrl.Collector(ENV, policy, url, client=client, num_workers=1, envs_per_worker=n_envs,
                          frames_per_batch=40, total_frames=120, max_frames_per_traj=limit,
                          init_random_frames=random_frames, seed=seed) as collector:
        assert collector.action_space == probe.action_space
        handles = list(collector)
    assert len(handles) == 3
    d = check_cheetah_store(url, 120, n_envs, limit, np.dtype(np.float64))
    act = d["action"]
    random_steps = random_frames // n_envs
    # The first frames sample the action space: within its bounds, and spread over them.
    first = act[:random_steps]
    assert ((first >= LOW) & (first <= HIGH)).all() and first.std() > 0.3
    # The policy's Gaussian samples are stored as it gave them; the env gets them clipped to
    # the bounds, which re-stepping with the clipped actions reproduces exactly.
    assert len(np.unique(act[random_steps:])) > 10
    replay(lambda: make_cheetah(limit), d, seed, env_action=lambda a: np.clip(a, LOW, HIGH))


@pytest.mark.timeout(400)
def test_halfcheetah_float32_observations_through_the_cli(tmp_path):
    url = str(tmp_path / "cheetah-cli")
    # The embedded cluster (not the session's, whose workers run elsewhere): its worker
    # processes run in tmp_path, where MuJoCo writes its log.
    out = daskrl_main("collect", "--env", ENV, "--store", url,
                      "--wrapper", "gymnasium.wrappers.DtypeObservation:dtype='float32'",
                      "--workers", "1", "--envs-per-worker", "2", "--frames-per-batch", "40",
                      "--frames", "80", "--max-frames-per-traj", "15",
                      "--init-random-frames", "80", "--seed", "5", "--no-tls", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["frames"] == 80
    d = check_cheetah_store(url, 80, 2, 15, np.dtype(np.float32))
    assert ((d["action"] >= LOW) & (d["action"] <= HIGH)).all()
    replay(lambda: make_cheetah(15, np.float32), d, seed=5)
