"""A native vector env of counting sub-envs, in every autoreset mode."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class CountingVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` counting sub-envs as one native vector env, in any autoreset mode.

    Sub-env ``i`` counts as a :class:`CountingEnv` of length ``length + i`` (so the sub-envs'
    episodes end at different steps): observation ``[episode, t]``, reward ``t + 1``,
    terminated after ``length + i`` steps, so every stored transition must satisfy
    ``next_observation == observation + [0, 1]``. ``autoreset_mode`` (a
    ``gymnasium.vector.AutoresetMode`` or its value):

    * ``"NextStep"``: the step after an end resets the sub-env (reward 0, no end, the action
      ignored); ``reset()`` resets every sub-env whatever its options, as gymnasium's
      ``CartPoleVectorEnv`` does.
    * ``"SameStep"``: the step that ends an episode returns the next one's first observation,
      the final one in ``info["final_obs"]`` (masked by ``info["_final_obs"]``).
    * ``"Disabled"``: ended sub-envs must be reset with ``reset(options={"reset_mask": m})``
      before the next step (which raises otherwise).

    ``dict_obs=True``: the observation is a ``Dict`` ``{"count": [episode, t], "parity":
    [t % 2]}`` (a ``Box`` and a ``MultiBinary(1)``), batched as gymnasium batches it.
    ``infos=True``: each step's vector ``info`` holds ``t`` (int64, the step count the
    observation shows, masked by ``_t``) and, for the sub-envs that terminate,
    ``is_success``; in ``SameStep`` mode an ended sub-env's entries are in
    ``info["final_info"]`` (the top-level ones are its reset's: ``t == 0``), as gymnasium's
    ``SyncVectorEnv`` has them. Every stored ``info/t`` must equal the ``t`` of its
    ``next_observation``.
    """

    def __init__(self, num_envs: int = 3, length: int = 3,
                 autoreset_mode: Any = "NextStep", dict_obs: bool = False,
                 infos: bool = False) -> None:
        from gymnasium.vector import AutoresetMode
        from gymnasium.vector.utils import batch_space

        self.mode = AutoresetMode(getattr(autoreset_mode, "value", autoreset_mode))
        self.metadata = {"autoreset_mode": self.mode}
        self.num_envs = num_envs
        self.dict_obs, self.infos = dict_obs, infos
        count = spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.single_observation_space = (
            spaces.Dict({"count": count, "parity": spaces.MultiBinary(1)}) if dict_obs
            else count)
        self.single_action_space = spaces.Discrete(2)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.lengths = length + np.arange(num_envs)
        self.episode = np.full(num_envs, -1, np.int64)
        self.t = np.zeros(num_envs, np.int64)
        self.ended = np.zeros(num_envs, np.bool_)

    def _obs(self) -> Any:
        count = np.stack([self.episode, self.t], axis=1).astype(np.float32)
        if not self.dict_obs:
            return count
        return {"count": count, "parity": (self.t % 2).astype(np.int8).reshape(-1, 1)}

    def _row(self, obs: Any, i: int) -> Any:
        return {k: v[i].copy() for k, v in obs.items()} if self.dict_obs else obs[i].copy()

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None):
        from gymnasium.vector import AutoresetMode

        super().reset(seed=seed)
        mask = (options or {}).get("reset_mask")
        if mask is None or self.mode is AutoresetMode.NEXT_STEP:
            mask = np.ones(self.num_envs, np.bool_)
        self.episode[mask] += 1
        self.t[mask] = 0
        self.ended[mask] = False
        return self._obs(), {}

    def step(self, actions: Any):
        from gymnasium.vector import AutoresetMode

        if np.shape(actions) != (self.num_envs,):
            raise ValueError(f"expected {self.num_envs} actions, got shape {np.shape(actions)}")
        if self.mode is AutoresetMode.DISABLED and self.ended.any():
            raise RuntimeError(f"sub-envs {np.flatnonzero(self.ended).tolist()} ended and were "
                               "not reset (autoreset mode Disabled)")
        resetting = self.ended if self.mode is AutoresetMode.NEXT_STEP else np.zeros_like(
            self.ended)
        live = ~resetting
        self.episode[resetting] += 1
        self.t[resetting] = 0
        self.t[live] += 1
        reward = np.where(live, self.t, 0).astype(np.float64)
        terminated = live & (self.t >= self.lengths)
        truncated = np.zeros(self.num_envs, np.bool_)
        obs = self._obs()
        info: dict[str, Any] = {}
        if self.infos:
            info = {"t": self.t.copy(), "_t": np.ones(self.num_envs, np.bool_)}
            if terminated.any():
                info.update(is_success=terminated.copy(), _is_success=terminated.copy())
        if self.mode is AutoresetMode.SAME_STEP:
            if terminated.any():
                final = np.full(self.num_envs, None, dtype=object)
                for i in np.flatnonzero(terminated).tolist():
                    final[i] = self._row(obs, i)
                if self.infos:  # the ended sub-envs' entries: their reset's at the top
                    info["final_info"] = {k: v.copy() for k, v in info.items()}
                    info["_final_info"] = terminated.copy()
                    info.pop("is_success")
                    info.pop("_is_success")
                    info["t"][terminated] = 0
                info.update(final_obs=final, _final_obs=terminated.copy())
                self.episode[terminated] += 1
                self.t[terminated] = 0
                obs = self._obs()
        else:
            self.ended = terminated.copy()
        return obs, reward, terminated, truncated, info
