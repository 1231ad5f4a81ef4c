"""Rollouts: a set of gymnasium envs stepped together by a torch policy for ``T`` steps.

An :class:`EnvSet` lives on its worker between tasks, so episodes continue across batches.  It
steps its envs itself rather than through ``gymnasium.vector.SyncVectorEnv``: that gives
gymnasium's *same-step* autoreset (every stored transition is real; ``next_observation`` at an
episode end is the true final observation) together with per-env error attribution.
"""

from __future__ import annotations

import time
import traceback
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from daskrl.errors import BatchTimeoutError, EnvError
from daskrl.store._layout import EPISODE_ID_STRIDE, episode_id_base
from daskrl.worker._envs import EnvSpec
from daskrl.worker._infos import InfoRecorder, InfoSpecs
from daskrl.worker._policy_output import OutputReader, policy_error
from daskrl.worker._spaces import Leaf, SpaceLayout

__all__ = ["EPISODE_ID_STRIDE", "EnvSet", "episode_columns", "non_finite_error"]



def _env_error(what: str, e: BaseException) -> EnvError:
    """An :class:`EnvError` that carries the env's own traceback in its message: exception
    chains do not survive pickling from a Dask worker."""
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip()
    return EnvError(f"{what}: {e!r}\n--- the env's traceback, on the worker ---\n{tb}")


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


class EnvSet:
    """``E`` environments of one collection stream, with their episode bookkeeping."""

    def __init__(self, spec: EnvSpec, n_envs: int, seed: int, stream: int,
                 restart: tuple[int, ...] = (), info_keys: tuple[str, ...] = ()) -> None:
        self.spec = spec
        self.n_envs = n_envs
        self.info_keys = info_keys
        self.info_specs: InfoSpecs = {}
        """Shapes and dtypes of the info entries, as first reported (kept across batches)."""
        self.envs: list[gym.Env] = [spec.make() for _ in range(n_envs)]
        self.obs_space = self.envs[0].observation_space
        self.act_space = self.envs[0].action_space
        # A Dict or Tuple space is one buffer per leaf (a flat space: one leaf).
        self.obs_layout = SpaceLayout(self.obs_space)
        self.act_layout = SpaceLayout(self.act_space)
        # A stream's envs seed from (seed, stream); envs rebuilt mid-stream (``restart``: the
        # batch id they were rebuilt for) get a stream of their own, so no episode repeats.
        key = [seed, stream, *restart]
        seeds = np.random.SeedSequence(key).spawn(n_envs)
        self._seeds = [int(s.generate_state(1)[0]) for s in seeds]
        for env, s in zip(self.envs, self._seeds):
            env.action_space.seed(s)
        self._needs_reset = True
        self.obs = [np.zeros((n_envs, *leaf.shape), leaf.dtype) for leaf in self.obs_layout.leaves]
        """The envs' current observations, one array ``[E, ...]`` per leaf of the space."""
        self.episode_id = np.zeros(n_envs, np.int64)
        self.episode_step = np.zeros(n_envs, np.int64)
        self.episode_return = np.zeros(n_envs, np.float64)
        self._first_reset = True
        self.last_batch_id: int | None = None
        """The batch this env set collected last (its envs continue from there)."""

    def close(self) -> None:
        """Close every env."""
        for env in self.envs:
            env.close()

    def _reset(self, i: int, batch_id: int, t: int) -> None:
        """Reset env ``i`` (its first reset seeded) and put its observation in :attr:`obs`."""
        seed = self._seeds[i] if self._first_reset else None
        try:
            obs, _ = self.envs[i].reset(seed=seed)
        except Exception as e:
            raise _env_error(f"env {self.spec.name} (env index {i}) raised in reset() at "
                             f"step {t} of batch {batch_id}", e) from e
        self._put_obs(self.obs, i, obs, t, batch_id, "reset()")

    def _new_arrays(self, steps: int) -> dict[str, np.ndarray]:
        """A batch's ``[T, E, ...]`` arrays, but for the action and the policy's extras (their
        shapes come from its first output)."""
        E = self.n_envs
        out: dict[str, np.ndarray] = {}
        for key in ("observation", "next_observation"):
            for name, cur in zip(self.obs_layout.names(key), self.obs):
                out[name] = np.empty((steps, *cur.shape), cur.dtype)
        out.update({
            "reward": np.empty((steps, E), np.float32),
            "terminated": np.empty((steps, E), np.bool_),
            "truncated": np.empty((steps, E), np.bool_),
        })
        return out

    def collect(
        self,
        policy: torch.nn.Module,
        device: torch.device,
        steps: int,
        batch_id: int,
        random_steps: int = 0,
        reset: bool = False,
        batch_timeout: float | None = None,
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Step every env ``steps`` times; return ``(arrays [T, E, ...], stats)``.

        The loop does per step only what the step needs (the envs' outputs, checked; the
        policy's; the resets); ``episode_id`` and ``step`` are derived at the end from where
        episodes started, and on CPU the policy reads tensors made once over :attr:`obs`."""
        E = self.n_envs
        if reset or self._needs_reset:
            for i in range(E):
                self._reset(i, batch_id, 0)
            self.episode_id[:] = episode_id_base(batch_id) + np.arange(E)
            self.episode_step[:] = 0
            self.episode_return[:] = 0.0
            self._first_reset = False
            self._needs_reset = False
        out = self._new_arrays(steps)
        rewards_out, term_out, trunc_out = out["reward"], out["terminated"], out["truncated"]
        extras: dict[str, np.ndarray] = {}
        returns: list[float] = []
        lengths: list[int] = []
        obs_bufs = [out[n] for n in self.obs_layout.names("observation")]
        next_bufs = [out[n] for n in self.obs_layout.names("next_observation")]
        act_bufs: list[np.ndarray] = []
        infos: list[Any] = [None] * E
        recorder = InfoRecorder(self.info_keys, steps, E, env_name=self.spec.name,
                                batch_id=batch_id, specs=self.info_specs)
        keep_infos = bool(self.info_keys)
        episode_return = self.episode_return
        # Each env's episode: the row it started at (negative: before this batch), its id.
        start_row = (-self.episode_step).tolist()
        episode_ids = self.episode_id.tolist()
        starts: list[tuple[int, int]] = []  # (row, env) of each episode started in the batch
        id_base = episode_id_base(batch_id)
        to_env = (_discrete_actions if isinstance(self.act_space, spaces.Discrete)
                  else self._env_actions)
        # On CPU the policy reads the observations in place, through tensors made once (they
        # are not changed until the policy has returned); elsewhere they are copied over.
        on_cpu = device.type == "cpu"
        obs_in = [torch.from_numpy(cur) for cur in self.obs] if on_cpu else []
        # One leaf (no Dict or Tuple space): each env's observation is checked and stored here,
        # without :meth:`_put_obs` (which takes over for anything but an array of its shape).
        flat_shape = None if self.obs_layout.structured else self.obs_layout.leaves[0].shape
        deadline = None if batch_timeout is None else time.monotonic() + batch_timeout
        no_grad = torch.inference_mode()
        t0 = time.perf_counter()
        for t in range(steps):
            for buf, cur in zip(obs_bufs, self.obs):
                buf[t] = cur
            obs_t = self.obs_layout.join(obs_in if on_cpu else [
                torch.as_tensor(cur, device=device) for cur in self.obs])
            try:
                with no_grad:
                    policy_out = policy(obs_t)
            except Exception as e:
                raise policy_error(e, self.spec.name, t, batch_id, obs_t) from e
            if t == 0:
                read = OutputReader(policy_out, self.act_space, E, self.spec.name)
            actions, extra_np = read(policy_out)
            if t == 0:
                for name, a in zip(self.act_layout.names("action"), actions):
                    out[name] = np.empty((steps, *a.shape), a.dtype)
                    act_bufs.append(out[name])
                for k, v in extra_np.items():
                    extras[k] = np.empty((steps, *v.shape), v.dtype)
            for k, v in extra_np.items():
                extras[k][t] = v
            if t < random_steps:
                samples = [self.act_layout.split(env.action_space.sample()) for env in self.envs]
                actions = [np.stack([s[j] for s in samples]).astype(buf.dtype, copy=False)
                           .reshape(a.shape) for j, (buf, a) in enumerate(zip(act_bufs, actions))]
            for buf, a in zip(act_bufs, actions):
                buf[t] = a
            env_actions = to_env(actions)
            next_obs = [buf[t] for buf in next_bufs]
            rewards: list[Any] = [0.0] * E  # what each env returned, checked below
            terminated: list[Any] = [False] * E
            truncated: list[Any] = [False] * E
            for i, env in enumerate(self.envs):
                try:
                    nobs, rewards[i], terminated[i], truncated[i], infos[i] = env.step(
                        env_actions[i])
                except Exception as e:
                    raise _env_error(f"env {self.spec.name} (env index {i}) raised in step() "
                                     f"at step {t} of batch {batch_id}", e) from e
                if flat_shape is not None:
                    try:
                        ok = nobs.shape == flat_shape and nobs.dtype.kind in "biuf"
                    except AttributeError:  # not an array: _put_obs checks it, or names it
                        ok = False
                    if ok:
                        next_obs[0][i] = nobs
                        continue
                self._put_obs(next_obs, i, nobs, t, batch_id, "step()")
            # One conversion per step checks all envs' outputs at once; only a wrong one takes
            # the slow path that finds and names it.
            try:
                reward_a = np.asarray(rewards)
                term_a = np.asarray(terminated)
                trunc_a = np.asarray(truncated)
            except ValueError:  # arrays of different shapes
                reward_a = term_a = trunc_a = np.empty(0)
            if not (reward_a.shape == term_a.shape == trunc_a.shape == (E,)
                    and reward_a.dtype.kind in "biuf"
                    and term_a.dtype.kind == trunc_a.dtype.kind == "b"):
                reward_a, term_a, trunc_a = self._check_step_outputs(
                    rewards, terminated, truncated, t, batch_id)
            rewards_out[t] = reward_a
            term_out[t] = term_a
            trunc_out[t] = trunc_a
            episode_return += reward_a  # float64 sums of the env's own rewards
            for cur, nxt in zip(self.obs, next_obs):
                cur[...] = nxt
            if keep_infos:
                recorder.record(t, infos, done=term_a | trunc_a)
            if True in terminated or True in truncated:  # (bools, or 0/1: checked above)
                ended = [i for i in range(E) if terminated[i] or truncated[i]]
                if not keep_infos:
                    recorder.episode_ends(ended, infos, t)
                for i in ended:
                    returns.append(float(episode_return[i]))
                    lengths.append(t + 1 - start_row[i])
                    self._reset(i, batch_id, t + 1)
                    episode_return[i] = 0.0
                    start_row[i] = t + 1
                    episode_ids[i] = id_base + (t + 1) * E + i
                    starts.append((t + 1, i))
            if deadline is not None and time.monotonic() > deadline:
                raise BatchTimeoutError(
                    f"batch {batch_id} ran past its deadline of {batch_timeout:g}s at step {t} of "
                    f"{steps} (env {self.spec.name}); it was stopped and its partial data "
                    "discarded. Raise batch_timeout or lower frames_per_batch."
                )
        elapsed = time.perf_counter() - t0
        out["episode_id"], out["step"] = episode_columns(
            steps, E, id_base, self.episode_id, self.episode_step, starts)
        self.episode_id[:] = episode_ids
        self.episode_step[:] = steps - np.asarray(start_row)
        if self.episode_step.max() >= self.spec.endless_episode_steps:
            i = int(self.episode_step.argmax())
            raise EnvError(
                f"env {self.spec.name} (env index {i}) has run an episode of "
                f"{int(self.episode_step[i])} steps without terminating or truncating. Set "
                "max_frames_per_traj to truncate long episodes."
            )
        if (err := non_finite_error(out, self.obs_layout, self.spec.name, batch_id)) is not None:
            self._needs_reset = True
            raise err
        out.update(recorder.arrays())
        self.last_batch_id = batch_id
        out.update(extras)
        stats = {
            "episode_returns": tuple(returns),
            "episode_lengths": tuple(lengths),
            "episode_stats": tuple(recorder.episodes),
            "rollout_seconds": elapsed,
        }
        return out, stats

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

    def _check_step_outputs(
        self, rewards: list[Any], terminated: list[Any], truncated: list[Any], t: int,
        batch_id: int,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Raise :class:`EnvError` naming the first env whose ``step()`` returned a reward
        that is not one real number, or a ``terminated``/``truncated`` that is not a bool;
        return the outputs as arrays otherwise (flags given as integers 0 and 1 are bools)."""
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
                self._needs_reset = True
                raise EnvError(
                    f"env {self.spec.name} (env index {i}) returned from step() {got} "
                    f"({type(value).__name__}) at step {t} of batch {batch_id}: {todo} Fix "
                    "the env; the batch was discarded."
                )
        return (np.array([float(r) for r in rewards]), np.array([bool(x) for x in terminated]),
                np.array([bool(x) for x in truncated]))

    def _env_actions(self, actions: list[np.ndarray]) -> list[Any]:
        """Per-env actions for ``env.step`` from the leaves' ``[E, ...]`` arrays: Box clipped
        to bounds, Discrete as Python ints; a dict or tuple of them for a Dict or Tuple space."""
        if not self.act_layout.structured:
            return _leaf_actions(self.act_space, actions[0])
        per_leaf = [_leaf_actions(leaf.space, a)
                    for leaf, a in zip(self.act_layout.leaves, actions)]
        return [self.act_layout.join([p[i] for p in per_leaf]) for i in range(self.n_envs)]


def episode_columns(steps: int, n_envs: int, id_base: int, carried_ids: np.ndarray,
                    carried_steps: np.ndarray, starts: list[tuple[int, int]]
                    ) -> tuple[np.ndarray, np.ndarray]:
    """A batch's ``episode_id`` and ``step`` arrays ``[T, E]``, from the episodes each env
    carried in (their ids and steps so far) and the ``(row, env)`` where new episodes started
    (id ``id_base + row * E + env``, step 0 there)."""
    rows = np.arange(steps)[:, None]
    # 1 + the row of each env's last start at or before each row; 0: the carried episode.
    last = np.zeros((steps, n_envs), np.int64)
    if starts:
        r, i = np.array(starts, np.int64).T
        inside = r < steps  # (an episode that ended on the last row starts in the next batch)
        last[r[inside], i[inside]] = r[inside] + 1
        np.maximum.accumulate(last, axis=0, out=last)
    carried = last == 0
    step = np.where(carried, carried_steps + rows, rows - last + 1)
    ids = np.where(carried, carried_ids, id_base + (last - 1) * n_envs + np.arange(n_envs))
    return ids, step


def non_finite_error(out: dict[str, np.ndarray], obs_layout: SpaceLayout, env_name: str,
                     batch_id: int) -> EnvError | None:
    """The error for the first non-finite float observation or reward of a rollout's
    ``[T, E, ...]`` arrays (``None`` when all are finite): it names the env index and step."""
    checks = [(leaf.name("next_observation"), leaf.label("observation"))
              for leaf in obs_layout.leaves] + [("reward", "reward")]
    for key, label in checks:
        arr = out[key]
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            bad = np.argwhere(~np.isfinite(arr.reshape(arr.shape[0], arr.shape[1], -1)))[0]
            return EnvError(
                f"env {env_name} (env index {bad[1]}) returned a non-finite "
                f"{label} at step {bad[0]} of batch {batch_id}. Fix the "
                "env or wrap it to sanitize its output; the batch was discarded."
            )
    return None


def _discrete_actions(actions: list[np.ndarray]) -> list[int]:
    """Per-env actions of a ``Discrete`` space (one leaf) as Python ints."""
    return actions[0].tolist()


def _leaf_actions(space: gym.Space, action: np.ndarray) -> list[Any]:
    """Per-env actions of one leaf space: Box clipped to bounds, Discrete as Python ints."""
    if isinstance(space, spaces.Box):
        clipped = np.clip(action, space.low, space.high).astype(space.dtype, copy=False)
        return list(clipped)
    if isinstance(space, spaces.Discrete):
        return action.tolist()
    return list(action.astype(space.dtype, copy=False))
