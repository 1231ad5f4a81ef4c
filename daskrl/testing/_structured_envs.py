"""Counting envs with ``Dict`` and ``Tuple`` spaces."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class GoalCountingEnv(gym.Env):
    """A goal-conditioned :class:`CountingEnv` with a ``Dict`` observation space, as gymnasium's
    robotics envs have it: ``{"observation": [episode, t], "achieved_goal": [t],
    "desired_goal": [length], "phase": t}`` (``phase`` a ``Discrete``); reward ``t + 1``;
    terminates when the achieved goal reaches the desired one (after ``length`` steps).

    ``dict_actions=True``: the action space is ``Dict({"step": Discrete(2), "force": Box(-1, 1,
    (2,))})`` and the observation also holds ``"last_force"``, the force the env received
    (clipped to the bounds), so a stored ``action`` can be checked against the
    ``next_observation`` it led to.  Every stored transition satisfies ``next["observation"]
    == observation["observation"] + [0, 1]``.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, length: int = 5, dict_actions: bool = False) -> None:
        self.length = length
        self.dict_actions = dict_actions
        entries: dict[str, gym.Space] = {
            "observation": spaces.Box(-np.inf, np.inf, (2,), np.float32),
            "achieved_goal": spaces.Box(-np.inf, np.inf, (1,), np.float32),
            "desired_goal": spaces.Box(-np.inf, np.inf, (1,), np.float32),
            "phase": spaces.Discrete(length + 1),
        }
        if dict_actions:
            entries["last_force"] = spaces.Box(-1.0, 1.0, (2,), np.float32)
            self.action_space = spaces.Dict({"step": spaces.Discrete(2),
                                             "force": spaces.Box(-1.0, 1.0, (2,), np.float32)})
        else:
            self.action_space = spaces.Discrete(2)
        self.observation_space = spaces.Dict(entries)
        self.episode = -1
        self.t = 0
        self.force = np.zeros(2, np.float32)

    def _obs(self) -> dict[str, Any]:
        obs: dict[str, Any] = {
            "observation": np.array([self.episode, self.t], np.float32),
            "achieved_goal": np.array([self.t], np.float32),
            "desired_goal": np.array([self.length], np.float32),
            "phase": self.t,
        }
        if self.dict_actions:
            obs["last_force"] = self.force.copy()
        return obs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        self.force = np.zeros(2, np.float32)
        return self._obs(), {}

    def step(self, action: Any):
        if self.dict_actions:
            if not self.action_space.contains(action):
                raise ValueError(f"action {action!r} is not in {self.action_space!r}")
            self.force = np.asarray(action["force"], np.float32)
        self.t += 1
        return self._obs(), float(self.t), self.t >= self.length, False, {}


class TupleCountingEnv(gym.Env):
    """A :class:`CountingEnv` with a ``Tuple`` observation space: ``([episode, t], t,
    bits)`` (a ``Box``, a ``Discrete`` and the ``MultiBinary(3)`` low bits of ``t``), and a
    ``Tuple`` action space ``(Discrete(2), Box(-1, 1, (1,)))``; reward ``t + 1``; terminates
    after ``length`` steps."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, length: int = 5) -> None:
        self.length = length
        self.observation_space = spaces.Tuple((
            spaces.Box(-np.inf, np.inf, (2,), np.float32), spaces.Discrete(length + 1),
            spaces.MultiBinary(3)))
        self.action_space = spaces.Tuple((spaces.Discrete(2),
                                          spaces.Box(-1.0, 1.0, (1,), np.float32)))
        self.episode = -1
        self.t = 0

    def _obs(self) -> tuple[Any, ...]:
        bits = np.array([(self.t >> b) & 1 for b in range(3)], np.int8)
        return np.array([self.episode, self.t], np.float32), self.t, bits

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any):
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} is not in {self.action_space!r}")
        self.t += 1
        return self._obs(), float(self.t), self.t >= self.length, False, {}


gym.register("GoalCounting-v0", entry_point="daskrl.testing:GoalCountingEnv", max_episode_steps=None)


gym.register("TupleCounting-v0", entry_point="daskrl.testing:TupleCountingEnv",
             max_episode_steps=None)
