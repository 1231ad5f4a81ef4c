"""Atari Pong through ale-py and gymnasium's Atari wrappers (the ``atari`` extra), on the
session's spawn-started LocalCluster and through ``daskrl collect`` (in this process, on the
same cluster): 84x84 grey frames in
stacks of 4, ``uint8``. The store holds exactly what the env gave: every stored frame is
compared byte for byte with what the same seeded env returns when the test re-steps it with
the recorded actions, and the frame stacks shift by one frame from step to step.

``ALE/...`` ids work with nothing imported by the user: daskrl imports ``ale_py`` for them on
the learner and on each worker (``daskrl/worker/_env_import.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import ale_py  # the atari extra (in the test extra: pip install -e ".[test]")
import gymnasium as gym
import numpy as np
import pytest
from cli_inprocess import daskrl_main
from env_replay import replay, stream_data

import daskrl
from daskrl.testing import SpacePolicy, check_episode_continuity

ENV = "ALE/Pong-v5"
ENV_KWARGS = {"frameskip": 1}  # AtariPreprocessing skips the frames (4) and max-pools them
WRAPPERS = ["gymnasium.wrappers.AtariPreprocessing",
            "gymnasium.wrappers.FrameStackObservation:stack_size=4"]
FRAME = (4, 84, 84)


def make_pong(max_episode_steps: int) -> gym.Env:
    """The env as the test builds it, with gymnasium alone (not daskrl's code)."""
    gym.register_envs(ale_py)
    env = gym.make(ENV, **ENV_KWARGS)
    env = gym.wrappers.AtariPreprocessing(env)
    env = gym.wrappers.FrameStackObservation(env, stack_size=4)
    return gym.wrappers.TimeLimit(env, max_episode_steps=max_episode_steps)


def check_pong_store(url: str, seed: int, n_envs: int, max_episode_steps: int,
                     frames: int) -> dict[str, np.ndarray]:
    """The store's guarantees on pixels, and its frames against a re-stepped env."""
    store = daskrl.open_store(url)
    assert store.frames == frames
    check_episode_continuity(store)
    d = stream_data(url)
    obs, nxt, step = d["observation"], d["next_observation"], d["step"]
    T = frames // n_envs
    assert obs.shape == nxt.shape == (T, n_envs, *FRAME)
    assert obs.dtype == nxt.dtype == np.uint8
    assert d["action"].dtype == np.int64 and ((d["action"] >= 0) & (d["action"] < 6)).all()
    ended = d["terminated"] | d["truncated"]
    assert ended.any() and (step[ended] == max_episode_steps - 1).all()
    # Only real transitions: within an episode, the next row starts where this one ended.
    same = ~ended[:-1]
    np.testing.assert_array_equal(obs[1:][same], nxt[:-1][same])
    # The stacks shift by one frame per step, the final step's too (the true final frames).
    np.testing.assert_array_equal(nxt[:, :, :3], obs[:, :, 1:])
    # An episode starts with its reset frame repeated (FrameStackObservation's padding).
    first = obs[step == 0]
    assert len(first) >= 2 * n_envs
    np.testing.assert_array_equal(first, np.repeat(first[:, :1], 4, axis=1))
    assert not (obs == obs[:, :, :1]).all()  # ... and the game moves after it
    # Byte for byte what the env gives, every frame of every step.
    replay(lambda: make_pong(max_episode_steps), d, seed, env_action=int)
    return d


def container_bytes(url: str) -> int:
    """Bytes of the store's batch containers on disk (what the frames cost)."""
    return sum(p.stat().st_size for p in Path(url).rglob("*.zip"))


@pytest.mark.timeout(400)
def test_pong_through_the_collector_round_trips_byte_for_byte(client, tmp_path):
    url = str(tmp_path / "pong")
    seed, n_envs, limit = 7, 2, 30
    policy = SpacePolicy(gym.spaces.Discrete(6))
    with daskrl.Collector(ENV, policy, url, client=client, env_kwargs=ENV_KWARGS,
                          wrappers=WRAPPERS, num_workers=1, envs_per_worker=n_envs,
                          frames_per_batch=80, total_frames=160, max_frames_per_traj=limit,
                          seed=seed) as collector:
        assert collector.observation_space == gym.spaces.Box(0, 255, FRAME, np.uint8)
        handles = list(collector)
    assert len(handles) == 2
    # Episodes of 30 steps over batches of 40: one crosses from the first batch into the next.
    assert sorted(n for h in handles for n in h.episode_lengths) == [limit] * 4
    check_pong_store(url, seed, n_envs, limit, frames=160)
    settings = daskrl.open_store(url).runs()[0]["settings"]
    assert settings["wrappers"] == WRAPPERS
    assert settings["observation_space"] == "Box(0, 255, (4, 84, 84), uint8)"
    per_frame = container_bytes(url) / 160
    print(f"Pong, zstd (default): {per_frame:.0f} bytes per frame stored "
          f"(raw: 2 x {np.prod(FRAME)} of observation and next_observation)")
    assert 0 < per_frame < 2 * np.prod(FRAME)  # the frame stacks compress


@pytest.mark.timeout(400)
def test_pong_through_the_cli_with_wrappers(cluster, tmp_path):
    url = str(tmp_path / "pong-cli")
    out = daskrl_main("collect", "--env", ENV, "--store", url,
                      "--env-kwargs", json.dumps(ENV_KWARGS), "--wrapper", WRAPPERS[0],
                      "--wrapper", "gymnasium.wrappers.FrameStackObservation:stack_size=4",
                      "--workers", "1", "--envs-per-worker", "2", "--frames-per-batch", "64",
                      "--frames", "128", "--max-frames-per-traj", "20", "--seed", "3",
                      "--scheduler", cluster.scheduler_address, "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["frames"] == 128
    d = check_pong_store(url, seed=3, n_envs=2, max_episode_steps=20, frames=128)
    assert "log_prob" in daskrl.open_store(url).handles()[0].load()  # the CLI's MLP policy
    assert len(np.unique(d["action"])) > 1


def test_pong_without_frameskip_1_exits_3_naming_the_wrapper(tmp_path):
    # AtariPreprocessing skips frames itself; on an env that also skips, the learner's probe
    # refuses it before any cluster starts.
    out = daskrl_main("collect", "--env", ENV, "--store", str(tmp_path / "s"),
                      "--wrapper", WRAPPERS[0], "--no-tls", cwd=tmp_path)
    assert out.returncode == 3, out.stderr
    assert "wrapper 'gymnasium.wrappers.AtariPreprocessing' failed on env 'ALE/Pong-v5'" in (
        out.stderr)
    assert "Disable frame-skipping" in out.stderr
    assert not (tmp_path / "s").exists()
