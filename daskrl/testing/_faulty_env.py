"""An env that misbehaves on purpose, for fault tests."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from daskrl.testing._envs import CountingEnv


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


gym.register("Faulty-v0", entry_point="daskrl.testing:FaultyEnv", max_episode_steps=None)


"""``daskrl collect --env daskrl.testing:Faulty-v0 --env-kwargs '{"at": 40}'``: a misbehaving env
by id, for the command line."""
