"""Atari Pong through envpool (``envpool.make_gymnasium("Pong-v5")``: 4 stacked 84x84 grey
frames, ``uint8``) collected by ``Collector`` and ``daskrl collect`` (in this process, on the
session's cluster) with tiny budgets, and a Pong batch round-tripping through the store byte for byte: the test steps a second pool of the
same seed with the actions the store recorded (and resets its ended sub-envs as the worker did)
and compares every frame, reward and flag with what ``load()`` returns."""

from __future__ import annotations

import numpy as np
import pytest
from cli_inprocess import daskrl_main

import daskrl
from daskrl.testing import SpacePolicy, check_episode_continuity

envpool = pytest.importorskip("envpool")  # the envpool extra: pip install "daskrl[envpool]"

pytestmark = pytest.mark.timeout(300)

SEED, E, LIMIT = 1234, 8, 12
"""The pool's seed, its num_envs, and its max_episode_steps (so that sub-envs end, and are
reset, within the budget)."""


def _pong():
    return envpool.make_gymnasium("Pong-v5", num_envs=E, seed=SEED, max_episode_steps=LIMIT)


def test_pong_batches_round_trip_byte_for_byte(client, tmp_path):
    url = str(tmp_path / "pong")
    probe = _pong()
    policy = SpacePolicy(probe.single_action_space)  # random actions: every action matters
    probe.close()
    with daskrl.Collector(lambda: envpool.make_gymnasium(
            "Pong-v5", num_envs=E, seed=SEED, max_episode_steps=LIMIT), policy, url,
            client=client, frames_per_batch=16 * E, total_frames=32 * E, num_workers=1) as c:
        assert c.config.envs_per_worker == E
        assert c.observation_space.shape == (4, 84, 84)
        handles = sorted(c, key=lambda h: h.batch_id)
    assert len(handles) == 2
    store = daskrl.open_store(url)
    check_episode_continuity(store)
    pool = _pong()
    obs, _ = pool.reset()
    ends = 0
    for h in handles:
        b = {k: v.numpy() for k, v in h.load().items()}
        assert b["observation"].dtype == np.uint8 and b["observation"].shape == (16, E, 4, 84, 84)
        for t in range(16):
            assert np.array_equal(b["observation"][t], obs), (h.batch_id, t)
            nobs, reward, terminated, truncated, _ = pool.step(b["action"][t])
            assert np.array_equal(b["next_observation"][t], nobs), (h.batch_id, t)
            assert np.array_equal(b["reward"][t], reward.astype(np.float32))
            assert np.array_equal(b["terminated"][t], terminated)
            assert np.array_equal(b["truncated"][t], truncated)
            done = terminated | truncated
            obs = nobs.copy()
            if done.any():  # the worker resets ended sub-envs at once (envpool resets one)
                ends += int(done.sum())
                first, info = pool.reset(options={"reset_mask": done})
                obs[done] = first[np.argsort(info["env_id"], kind="stable")]
    assert ends >= E  # every sub-env ended (by the limit) and was reset at least once
    assert sum(len(h.episode_lengths) for h in handles) == ends
    assert set(n for h in handles for n in h.episode_lengths) == {LIMIT}
    pool.close()


def test_cli_collects_pong_through_envpool(cluster, tmp_path):
    store = tmp_path / "s"
    out = daskrl_main(
        "collect", "--env", "envpool:make_gymnasium",
        "--env-kwargs", '{"task_id": "Pong-v5", "num_envs": 4, "max_episode_steps": 6}',
        "--frames", "64", "--frames-per-batch", "32", "--workers", "1", "--info-keys", "lives",
        "--store", str(store), "--no-progress", "--scheduler", cluster.scheduler_address,
        cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    reader = daskrl.open_store(str(store))
    assert reader.frames == 64 and reader.runs()[0]["settings"]["envs_per_worker"] == 4
    check_episode_continuity(reader)
    for h in reader:
        b = h.load()
        assert tuple(b["observation"].shape) == (8, 4, 4, 84, 84)
        assert str(b["observation"].dtype) == "torch.uint8"
        assert b["info"]["_lives"].all()
