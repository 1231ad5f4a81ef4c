"""Counting envs with a ``Box`` observation: every stored transition checks itself."""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class CountingEnv(gym.Env):
    """Observation ``[episode, t]``; reward ``t + 1``; terminates after ``length`` steps.

    Every stored transition must satisfy ``next_observation == observation + [0, 1]``, so a
    junk autoreset transition (``[e, length] -> [e + 1, 0]``) cannot hide.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, length: int = 5, env_var: str | None = None, delay: float = 0.0) -> None:
        self.length = length
        self.delay = delay  # seconds each step sleeps: a slow env, to catch batches in flight
        self.observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.episode = -1
        self.t = 0
        self.env_var_value = None
        if env_var is not None:
            import os

            self.env_var_value = os.environ.get(env_var)

    def _obs(self) -> np.ndarray:
        return np.array([self.episode, self.t], np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any):
        if self.delay:
            import time

            time.sleep(self.delay)
        self.t += 1
        return self._obs(), float(self.t), self.t >= self.length, False, {}


class EnvVarEnv(CountingEnv):
    """A :class:`CountingEnv` whose first observation entry starts at ``float($name)``.

    Shows that ``env_vars`` reached the worker before the env was built.
    """

    def __init__(self, name: str = "DASKRL_TEST_OFFSET", length: int = 5) -> None:
        import os

        super().__init__(length)
        self.offset = float(os.environ.get(name, "-1"))

    def _obs(self) -> np.ndarray:
        return np.array([self.offset + self.episode, self.t], np.float32)


gym.register("Counting-v0", entry_point="daskrl.testing:CountingEnv", max_episode_steps=None)


class InfoCountingEnv(CountingEnv):
    """A :class:`CountingEnv` that reports in its ``info``: ``lives`` (``length - t``) at
    every step, ``pos`` (``[episode, t]``, float32) at every step, and ``is_success`` (True)
    at the step it terminates only.

    ``fault="ragged"`` (``pos`` gets a third entry) or ``"string"`` (``lives`` is a string)
    from step ``at`` of an episode on, counted per env.
    """

    instances: ClassVar[int] = 0
    """Envs of this class built in this process (to count rebuilds on a worker)."""

    def __init__(self, length: int = 5, fault: str | None = None, at: int = 3) -> None:
        super().__init__(length)
        self.fault, self.at = fault, at
        InfoCountingEnv.instances += 1

    def step(self, action: Any):
        obs, r, term, trunc, _ = super().step(action)
        info: dict[str, Any] = {"lives": self.length - self.t,
                                "pos": np.array([self.episode, self.t], np.float32)}
        if term:
            info["is_success"] = True
        if self.fault is not None and self.t >= self.at:
            if self.fault == "ragged":
                info["pos"] = np.array([self.episode, self.t, 0], np.float32)
            elif self.fault == "string":
                info["lives"] = "many"
        return obs, r, term, trunc, info


gym.register("InfoCounting-v0", entry_point="daskrl.testing:InfoCountingEnv",
             max_episode_steps=None)


"""``daskrl collect --env daskrl.testing:GoalCounting-v0`` (a Dict observation space),
``daskrl.testing:TupleCounting-v0``, ``daskrl.testing:InfoCounting-v0 --info-keys lives``."""


def recorded_cartpole() -> gym.Env:
    """``CartPole-v1`` wrapped in ``gymnasium.wrappers.RecordEpisodeStatistics`` (an importable
    factory, for workers)."""
    return gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1"))


class SlowEnv(CountingEnv):
    """A :class:`CountingEnv` whose ``step`` sleeps ``delay`` seconds (for fault tests)."""

    def __init__(self, delay: float = 0.002, length: int = 7) -> None:
        super().__init__(length)
        self.delay = delay

    def step(self, action: Any):
        import time

        time.sleep(self.delay)
        return super().step(action)
