"""Re-step real envs with the actions a store recorded and compare what they return, byte for
byte, with what the store holds (tests/test_atari.py, tests/test_mujoco.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

import daskrl

KEYS = ("observation", "next_observation", "action", "reward", "terminated", "truncated",
        "step", "episode_id")


def stream_data(url: str) -> dict[str, np.ndarray]:
    """The batches of a one-stream store, in batch order, joined along time: ``[T, E, ...]``."""
    handles = sorted(daskrl.open_store(url).handles(), key=lambda h: h.batch_id)
    loaded = [h.load() for h in handles]
    return {k: np.concatenate([b[k].numpy() for b in loaded]) for k in KEYS}


def stream_seeds(seed: int, n_envs: int, stream: int = 0) -> list[int]:
    """The seeds daskrl gives the envs of a stream (docs/reproducibility.md)."""
    return [int(s.generate_state(1)[0])
            for s in np.random.SeedSequence([seed, stream]).spawn(n_envs)]


def replay(make_env: Callable[[], gym.Env], data: dict[str, np.ndarray], seed: int,
           env_action: Callable[[np.ndarray], Any] = lambda a: a) -> None:
    """Re-step each env of stream 0 from daskrl's seed for it with the recorded actions
    (``env_action`` turns a stored one into what the env received); its later resets continue
    its own generator, as daskrl's do. Every stored observation, next observation, reward and
    flag must be exactly what the env returned (bytes of the arrays, dtypes included; the
    reward as the store's float32)."""
    obs, nxt = data["observation"], data["next_observation"]
    T, E = data["step"].shape
    for i, env_seed in enumerate(stream_seeds(seed, E)):
        env = make_env()
        o, _ = env.reset(seed=env_seed)
        for t in range(T):
            assert obs[t, i].dtype == o.dtype and obs[t, i].tobytes() == o.tobytes(), (i, t)
            o, reward, terminated, truncated, _ = env.step(env_action(data["action"][t, i]))
            assert nxt[t, i].dtype == o.dtype and nxt[t, i].tobytes() == o.tobytes(), (i, t)
            assert (np.float32(reward), terminated, truncated) == (
                data["reward"][t, i], data["terminated"][t, i], data["truncated"][t, i]), (i, t)
            if terminated or truncated:
                o, _ = env.reset()
        env.close()
