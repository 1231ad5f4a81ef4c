"""Small, deterministic envs and policies for testing daskrl and code built on it.

They are importable on workers (a package module, not a test file), so they work with
spawn-started Dask workers.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from torch import nn

__all__ = ["ConstantPolicy", "CountingEnv", "EnvVarEnv", "TagPolicy"]


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


class TagPolicy(nn.Module):
    """Always action 0; reports its ``tag`` parameter as the extra output ``"tag"``.

    Set ``tag`` to the weights version before each ``update_weights`` to check which weights
    computed each stored step.
    """

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.tag = nn.Parameter(torch.zeros((), dtype=dtype))

    def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        n = obs.shape[0]
        return {
            "action": torch.zeros(n, dtype=torch.int64, device=obs.device),
            "tag": self.tag.detach().float().expand(n).clone(),
        }


class ConstantPolicy(nn.Module):
    """Returns a fixed action for every env (for Box or Discrete spaces)."""

    def __init__(self, action: Any, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.register_buffer("action", torch.as_tensor(action, dtype=dtype))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.action.expand(obs.shape[0], *self.action.shape).clone()


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


gym.register("Counting-v0", entry_point=CountingEnv, max_episode_steps=None)
