"""A stream's single gymnasium envs, stepped as one vector env that resets one sub-env at a time.

:class:`SingleEnvs` steps its envs itself rather than through ``gymnasium.vector.SyncVectorEnv``:
that gives gymnasium's *same-step* autoreset (every stored transition is real;
``next_observation`` at an episode end is the true final observation) together with per-env
error attribution, and lets each env's observation go straight into the batch's arrays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from daskrl.errors import EnvError
from daskrl.worker._batch import env_error
from daskrl.worker._envs import EnvSpec
from daskrl.worker._infos import InfoRecorder
from daskrl.worker._spaces import Leaf, SpaceLayout

__all__ = ["SingleEnvs"]


def _is_flag(x: Any) -> bool:
    """True for a bool (Python, numpy, 0-d array) or an integer 0 or 1."""
    if isinstance(x, (bool, np.bool_)):
        return True
    if isinstance(x, np.ndarray):
        return x.shape == () and (x.dtype == np.bool_ or (x.dtype.kind in "iu" and x in (0, 1)))
    return isinstance(x, (int, np.integer)) and x in (0, 1)


def _is_reward(x: Any) -> bool:
    """True for a real number (Python, numpy, 0-d array)."""
    if isinstance(x, np.ndarray):
        return x.shape == () and x.dtype.kind in "biuf"
    return isinstance(x, (int, float, np.integer, np.floating, np.bool_))


class SingleEnvs:
    """``E`` single envs as one vector env in same-step autoreset mode."""

    staggered = False
    """Every step is a real one for every env."""

    def __init__(self, spec: EnvSpec, n_envs: int, seeds: list[int]) -> None:
        self.spec = spec
        self.n_envs = n_envs
        self.envs: list[gym.Env] = [spec.make() for _ in range(n_envs)]
        self.obs_space = self.envs[0].observation_space
        self.act_space = self.envs[0].action_space
        # A Dict or Tuple space is one buffer per leaf (a flat space: one leaf).
        self.obs_layout = SpaceLayout(self.obs_space)
        self.act_layout = SpaceLayout(self.act_space)
        self._seeds = seeds
        self.action_spaces = [env.action_space for env in self.envs]
        """Each env's action space, seeded as the env is (random actions come from here)."""
        for space, s in zip(self.action_spaces, seeds):
            space.seed(s)
        self.obs = [np.zeros((n_envs, *leaf.shape), leaf.dtype) for leaf in self.obs_layout.leaves]
        """The envs' current observations, one array ``[E, ...]`` per leaf of the space."""
        self._first_reset = True
        # One leaf (no Dict or Tuple space): each env's observation is checked and stored in
        # :meth:`step` itself, without :meth:`_put_obs` (which takes over for anything but an
        # array of its shape).
        self._flat_shape = None if self.obs_layout.structured else self.obs_layout.leaves[0].shape
        self._discrete = isinstance(self.act_space, spaces.Discrete)
        self._leaf_space = None if self.act_layout.structured else self.act_space
        # What each env's step returned, rewritten every step.
        self._rewards: list[Any] = [0.0] * n_envs
        self._terminated: list[Any] = [False] * n_envs
        self._truncated: list[Any] = [False] * n_envs
        self._infos: list[Any] = [None] * n_envs

    def close(self) -> None:
        """Close every env."""
        for env in self.envs:
            env.close()

    def reset_all(self, batch_id: int) -> None:
        """Reset every env (the first time, each with its seed)."""
        for i in range(self.n_envs):
            self._reset(i, batch_id, 0)
        self._first_reset = False

    def reset_ended(self, ended: list[int], t: int, batch_id: int) -> None:
        """Reset the envs ``ended``, whose episodes ended at step ``t``."""
        for i in ended:
            self._reset(i, batch_id, t + 1)

    def _reset(self, i: int, batch_id: int, t: int) -> None:
        """Reset env ``i`` (its first reset seeded) and put its observation in :attr:`obs`."""
        seed = self._seeds[i] if self._first_reset else None
        try:
            obs, _ = self.envs[i].reset(seed=seed)
        except Exception as e:
            raise env_error(f"env {self.spec.name} (env index {i}) raised in reset() at "
                            f"step {t} of batch {batch_id}", e) from e
        self._put_obs(self.obs, i, obs, t, batch_id, "reset()")

    def info_recorders(self, recorder: InfoRecorder
                       ) -> tuple[Callable[..., None], Callable[..., None]]:
        """``record(t, infos, done=...)``, which records one step's infos, and
        ``record_ends(ended, infos, t)``, which takes only the episode statistics of the envs
        ``ended`` at step ``t`` (for a batch without ``info_keys``)."""
        return recorder.record, recorder.episode_ends

    def step(self, actions: list[np.ndarray], t: int, batch_id: int, deadline: float | None,
             next_obs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any, bool]:
        """Step every env with ``actions`` (one array ``[E, ...]`` per leaf); put their
        observations in row ``t`` of ``next_obs`` (``[T, E, ...]`` per leaf) and in
        :attr:`obs`. Return the rewards, terminated and truncated flags ``[E]``, the infos and
        whether some episode ended."""
        if self._discrete:
            env_actions = actions[0].tolist()
        elif self._leaf_space is not None:
            env_actions = _leaf_actions(self._leaf_space, actions[0])
        else:
            env_actions = self._env_actions(actions)
        rewards, terminated, truncated = self._rewards, self._terminated, self._truncated
        infos = self._infos
        flat_shape = self._flat_shape
        nxt = next_obs[0]
        for i, env in enumerate(self.envs):
            try:
                nobs, rewards[i], terminated[i], truncated[i], infos[i] = env.step(env_actions[i])
            except Exception as e:
                raise env_error(f"env {self.spec.name} (env index {i}) raised in step() "
                                f"at step {t} of batch {batch_id}", e) from e
            if flat_shape is not None:
                try:
                    ok = nobs.shape == flat_shape and nobs.dtype.kind in "biuf"
                except AttributeError:  # not an array: _put_obs checks it, or names it
                    ok = False
                if ok:
                    nxt[t, i] = nobs
                    continue
            self._put_obs([buf[t] for buf in next_obs], i, nobs, t, batch_id, "step()")
        # One conversion per step checks all envs' outputs at once; only a wrong one takes
        # the slow path that finds and names it.
        try:
            reward_a = np.asarray(rewards)
            term_a = np.asarray(terminated)
            trunc_a = np.asarray(truncated)
        except ValueError:  # arrays of different shapes
            reward_a = term_a = trunc_a = np.empty(0)
        if not (reward_a.shape == term_a.shape == trunc_a.shape == (self.n_envs,)
                and reward_a.dtype.kind in "biuf"
                and term_a.dtype.kind == trunc_a.dtype.kind == "b"):
            reward_a, term_a, trunc_a = self._check_step_outputs(t, batch_id)
        for cur, buf in zip(self.obs, next_obs):
            cur[...] = buf[t]
        return (reward_a, term_a, trunc_a, infos,
                True in terminated or True in truncated)  # (bools, or 0/1: checked above)

    def _put_obs(self, dst: list[np.ndarray], i: int, obs: Any, t: int, batch_id: int,
                 where: str) -> None:
        """Check env ``i``'s observation ``obs`` against the space and write its leaves to row
        ``i`` of ``dst`` (one array ``[E, ...]`` per leaf)."""
        if not self.obs_layout.structured:  # one leaf (the common case: no split)
            leaf = self.obs_layout.leaves[0]
            try:
                ok = obs.shape == leaf.shape and obs.dtype.kind in "biuf"
            except AttributeError:  # not an array
                ok = False
            if not ok:
                self._check_obs(obs, leaf, i, t, batch_id, where)
            dst[0][i] = obs
            return
        try:
            parts = self.obs_layout.split(obs)
        except ValueError as e:
            raise EnvError(
                f"env {self.spec.name} (env index {i}) returned from {where} an observation "
                f"that is {e}, at step {t} of batch {batch_id}; its observation space is "
                f"{self.obs_space!r}. Fix the env or its observation_space."
            ) from None
        for leaf, buf, part in zip(self.obs_layout.leaves, dst, parts):
            if getattr(part, "shape", None) != leaf.shape or part.dtype.kind not in "biuf":
                self._check_obs(part, leaf, i, t, batch_id, where)
            buf[i] = part

    def _check_obs(self, obs: Any, leaf: Leaf, i: int, t: int, batch_id: int,
                   where: str) -> None:
        arr = np.asarray(obs)
        if arr.shape != leaf.shape or arr.dtype.kind not in "biuf":
            what = (f"an observation whose {leaf.label('observation')} has" if leaf.path
                    else "an observation of")
            space = f" ({leaf.label('observation')}: {leaf.space!r})" if leaf.path else ""
            raise EnvError(
                f"env {self.spec.name} (env index {i}) returned from {where} {what} "
                f"shape {arr.shape} and dtype {arr.dtype} at step {t} of batch {batch_id}; its "
                f"observation space {self.obs_space!r}{space} says shape {leaf.shape}, dtype "
                f"{leaf.dtype}. Fix the env or its observation_space."
            )

    def _check_step_outputs(self, t: int, batch_id: int
                            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Raise :class:`EnvError` naming the first env whose ``step()`` returned a reward
        that is not one real number, or a ``terminated``/``truncated`` that is not a bool;
        return the outputs as arrays otherwise (flags given as integers 0 and 1 are bools)."""
        rewards, terminated, truncated = self._rewards, self._terminated, self._truncated
        for i in range(self.n_envs):
            for what, value, ok in (("reward", rewards[i], _is_reward),
                                    ("terminated", terminated[i], _is_flag),
                                    ("truncated", truncated[i], _is_flag)):
                if ok(value):
                    continue
                shape = getattr(value, "shape", None)
                got = (f"{what} of shape {tuple(shape)}" if shape not in (None, ())
                       else f"{what}={value!r}")
                if what == "reward":
                    todo = ("step() must return one real number as the reward; reduce a "
                            "vector reward to one (e.g. gymnasium.wrappers.TransformReward).")
                else:
                    todo = "step() must return terminated and truncated as bools (True/False)."
                raise EnvError(
                    f"env {self.spec.name} (env index {i}) returned from step() {got} "
                    f"({type(value).__name__}) at step {t} of batch {batch_id}: {todo} Fix "
                    "the env; the batch was discarded."
                )
        return (np.array([float(r) for r in rewards]), np.array([bool(x) for x in terminated]),
                np.array([bool(x) for x in truncated]))

    def _env_actions(self, actions: list[np.ndarray]) -> list[Any]:
        """Per-env actions for ``env.step`` from the leaves' ``[E, ...]`` arrays of a Dict or
        Tuple space: a dict or tuple per env of its leaves' actions (as :func:`_leaf_actions`)."""
        per_leaf = [_leaf_actions(leaf.space, a)
                    for leaf, a in zip(self.act_layout.leaves, actions)]
        return [self.act_layout.join([p[i] for p in per_leaf]) for i in range(self.n_envs)]


def _leaf_actions(space: gym.Space, action: np.ndarray) -> list[Any]:
    """Per-env actions of one leaf space: Box clipped to bounds, Discrete as Python ints."""
    if isinstance(space, spaces.Box):
        clipped = np.clip(action, space.low, space.high).astype(space.dtype, copy=False)
        return list(clipped)
    if isinstance(space, spaces.Discrete):
        return action.tolist()
    return list(action.astype(space.dtype, copy=False))
