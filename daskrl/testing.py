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

__all__ = [
    "ConstantPolicy",
    "CountingEnv",
    "EnvVarEnv",
    "EnvVarPolicy",
    "FaultyEnv",
    "NoisePolicy",
    "SlowEnv",
    "TagPolicy",
    "worker_weights",
]


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


def worker_weights(client: Any, collector: Any) -> dict[str, dict[str, bytes]]:
    """The raw bytes of every parameter/buffer each worker's policy holds now, by worker.

    For checking, bit for bit, what workers loaded against what the learner sent.
    """
    name = collector._plugin_name

    def read(dask_worker: Any) -> dict[str, bytes]:
        policy = dask_worker.plugins[name].policy
        tensors = dict(policy.named_parameters()) | dict(policy.named_buffers())
        return {k: _raw_bytes(t) for k, t in tensors.items()}

    return client.run(read)


def _raw_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes()


class SlowEnv(CountingEnv):
    """A :class:`CountingEnv` whose ``step`` sleeps ``delay`` seconds (for fault tests)."""

    def __init__(self, delay: float = 0.002, length: int = 7) -> None:
        super().__init__(length)
        self.delay = delay

    def step(self, action: Any):
        import time

        time.sleep(self.delay)
        return super().step(action)


class FaultyEnv(CountingEnv):
    """A :class:`CountingEnv` that misbehaves at its ``at``-th step (counted per process).

    ``fault`` is one of ``"raise"``, ``"reset"`` (raise in the next reset), ``"nan"``,
    ``"shape"``, ``"dtype"``, ``"hang"`` (sleep ``hang`` seconds), or a wrong step output:
    ``"reward-none"``, ``"reward-vector"``, ``"terminated-array"``, ``"terminated-str"`` (the
    string ``"no"``). With ``once=True`` only the
    first env of the process to reach the step misbehaves, so a restarted env works. Envs
    sharing a ``token`` share the step count; give each test its own.
    """

    _steps: dict[str, int] = {}
    _fired: set[str] = set()

    def __init__(self, fault: str = "raise", at: int = 10, once: bool = False,
                 hang: float = 5.0, length: int = 5, token: str = "") -> None:
        super().__init__(length)
        self.fault, self.at, self.once, self.hang, self.token = fault, at, once, hang, token
        self._reset_armed = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if self._reset_armed:
            raise RuntimeError("injected reset failure")
        return super().reset(seed=seed, options=options)

    def step(self, action: Any):
        steps = FaultyEnv._steps[self.token] = FaultyEnv._steps.get(self.token, 0) + 1
        obs, r, term, trunc, info = super().step(action)
        if steps >= self.at and not (self.once and self.token in FaultyEnv._fired):
            FaultyEnv._fired.add(self.token)
            if self.fault == "raise":
                raise RuntimeError("injected step failure")
            if self.fault == "reset":
                self._reset_armed = True
                return obs, r, True, trunc, info
            if self.fault == "nan":
                obs = obs.copy()
                obs[0] = np.nan
            elif self.fault == "shape":
                obs = np.zeros(3, np.float32)
            elif self.fault == "dtype":
                obs = np.array(["a", "b"])
            elif self.fault == "hang":
                import time

                time.sleep(self.hang)
            elif self.fault == "reward-none":
                r = None
            elif self.fault == "reward-vector":
                r = np.array([r, r])
            elif self.fault == "terminated-array":
                term = np.array([term])
            elif self.fault == "terminated-str":
                term = "no"
        return obs, r, term, trunc, info


class EnvVarPolicy(TagPolicy):
    """A :class:`TagPolicy` that reads the environment variable ``name`` at every step: it
    raises ``KeyError`` where that is unset (say, set on the learner but not on workers)."""

    def __init__(self, name: str = "DASKRL_TEST_POLICY_VAR") -> None:
        super().__init__()
        self.name = name

    def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        import os

        os.environ[self.name]  # the lookup is the point
        return super().forward(obs)


class NoisePolicy(nn.Module):
    """Action 0, plus an extra output ``"noise"`` of ``width`` incompressible floats per env."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.width = width

    def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        n = obs.shape[0]
        return {"action": torch.zeros(n, dtype=torch.int64), "noise": torch.rand(n, self.width)}
