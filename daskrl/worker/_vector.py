"""Rollouts on one ``gymnasium.vector.VectorEnv``: its ``num_envs`` sub-envs are a stream's ``E``.

The store holds the same data as from single envs (:mod:`daskrl.worker._rollout`): only real
transitions, the true final ``next_observation`` at an episode's end, episode ids, steps,
returns and lengths by the same rules, ``Dict``/``Tuple`` spaces as one array per leaf
(:class:`~daskrl.worker._spaces.SpaceLayout`), and ``info_keys`` entries and
``RecordEpisodeStatistics`` episodes from the vector ``info`` (:mod:`daskrl.worker._infos`).
How that comes out of each autoreset mode:

* ``SAME_STEP``: the step that ends an episode returns the next episode's first observation;
  the stored ``next_observation`` is the final one from ``info["final_obs"]``, and the info
  entries of that step are those of ``info["final_info"]``.
* ``DISABLED``, and ``NEXT_STEP`` where the vector env can reset sub-envs alone
  (:func:`~daskrl.worker._vector_envs.resets_one`): the sub-envs that ended are reset right away
  with ``reset(options={"reset_mask": ended})``, so every step is a real one for every sub-env.
* ``NEXT_STEP`` otherwise (``vector_entry_point`` envs, most ``VectorEnv`` subclasses): the
  step after an end is the env's own reset step, which ignores the action and is not stored.
  Each sub-env's column then fills at its own pace
  (:mod:`~daskrl.worker._vector_staggered`): the vector env is stepped until every column has
  its ``T`` transitions, and the transitions a column made beyond ``T`` open the stream's next
  batch (so they were chosen with the weights of the batch before).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from daskrl.errors import BatchTimeoutError, EnvError
from daskrl.store._layout import episode_id_base
from daskrl.worker._envs import EnvSpec
from daskrl.worker._infos import EPISODE_KEY, InfoRecorder, InfoSpecs
from daskrl.worker._policy_output import OutputReader, policy_error
from daskrl.worker._rollout import (
    EnvSet,
    _env_error,
    episode_columns,
    non_finite_error,
)
from daskrl.worker._spaces import SpaceLayout
from daskrl.worker._vector_envs import (
    AutoresetMode,
    autoreset_mode,
    building_seed,
    check_batch,
    check_envpool,
    close_vector,
    failed_index,
    first_seed,
    is_timeout,
    resets_one,
    step_vector,
    vector_action,
)
from daskrl.worker._vector_staggered import StaggeredSteps

__all__ = ["VectorEnvSet", "make_envset"]


class VectorEnvSet(StaggeredSteps):
    """One stream's vector env, with its episode bookkeeping (as :class:`EnvSet`)."""

    def __init__(self, spec: EnvSpec, n_envs: int, seed: int, stream: int,
                 restart: tuple[int, ...] = (), info_keys: tuple[str, ...] = ()) -> None:
        self.spec = spec
        self.n_envs = n_envs
        self.info_keys = info_keys
        self.info_specs: InfoSpecs = {}
        """Shapes and dtypes of the info entries, as first reported (kept across batches)."""
        key = [seed, stream, *restart]  # the same seed streams as single envs
        self._seeds = [int(s.generate_state(1)[0])
                       for s in np.random.SeedSequence(key).spawn(n_envs)]
        # one seed for a vector env that takes one; 31 bits, as envpool's must be
        vector_seed = int(np.random.SeedSequence(key).generate_state(1)[0]) & 0x7FFF_FFFF
        with building_seed(vector_seed):
            self.venv = spec.make_vector()
        self._broken = False
        try:
            self._setup(vector_seed)
        except BaseException:
            self.close()
            raise
        self.last_batch_id: int | None = None
        """The batch this env set collected last (its envs continue from there)."""

    def _setup(self, vector_seed: int) -> None:
        venv, name, E = self.venv, self.spec.name, self.n_envs
        if venv.num_envs != E:
            raise EnvError(f"env {name} built a vector env of num_envs={venv.num_envs}; this "
                           f"collection has envs_per_worker={E}.")
        check_envpool(venv, name)
        self.obs_space = venv.single_observation_space
        self.act_space = venv.single_action_space
        self.mode = autoreset_mode(venv, name)
        # A Dict or Tuple space is one buffer per leaf (a flat space: one leaf).
        self.obs_layout = SpaceLayout(self.obs_space)
        self.act_layout = SpaceLayout(self.act_space)
        self.obs_names = self.obs_layout.names("observation")
        self.next_names = self.obs_layout.names("next_observation")
        self.act_names = self.act_layout.names("action")
        self.staggered = self.mode is AutoresetMode.NEXT_STEP and not resets_one(venv)
        """The env's own reset steps are skipped, and columns fill at their own pace."""
        self._first_seed = first_seed(venv, self._seeds, vector_seed)
        self._action_spaces = [copy.deepcopy(self.act_space) for _ in range(E)]
        for space, s in zip(self._action_spaces, self._seeds):
            space.seed(s)
        self.obs = [np.zeros((E, *leaf.shape), leaf.dtype) for leaf in self.obs_layout.leaves]
        """The sub-envs' current observations, one array ``[E, ...]`` per leaf of the space."""
        self.episode_id = np.zeros(E, np.int64)
        self.episode_step = np.zeros(E, np.int64)
        self.episode_return = np.zeros(E, np.float64)
        self._needs_reset = True
        self._first_reset = True
        self._awaiting = np.zeros(E, np.bool_)
        """Staggered: columns whose next step is the env's reset step."""
        self._carry: dict[str, np.ndarray] | None = None
        """Staggered: what columns made past the last batch, for the next (``[K, E, ...]``)."""
        self._carry_n = np.zeros(E, np.int64)
        self._info_carry: list[tuple[np.ndarray, Any, np.ndarray, np.ndarray]] = []
        """Staggered: the infos of the carried rows, ``(rows, info, envs, done)`` per step."""
        self._batch_timeout: float | None = None
        self._read: OutputReader | None = None
        """Reads the policy's outputs; made from each batch's first."""

    def close(self) -> None:
        """Close the vector env."""
        close_vector(self.venv, self._broken)

    # -- the env's calls, checked -------------------------------------------------------------
    def _where(self, e: BaseException) -> str:
        i = failed_index(self.venv, e)
        return f"env {self.spec.name} (env index {i})" if i is not None else (
            f"vector env {self.spec.name}")

    def _raise_env(self, what: str, e: Exception) -> EnvError:
        self._broken = self._needs_reset = True
        err = _env_error(f"{self._where(e)} raised in {what}", e)
        trace = getattr(e, "daskrl_trace", None)
        if trace:
            err = EnvError(f"{err}\n--- the sub-process's traceback ---\n{trace}")
        return err

    def _check_obs(self, obs: Any, rows: int | None, where: str, t: int, batch_id: int
                   ) -> list[np.ndarray]:
        """The leaves of ``rows`` sub-envs' observations ``obs``, each ``[rows, ...]`` (one
        sub-env's observation for ``rows=None``), checked against the single observation
        space."""
        try:
            parts = self.obs_layout.split(obs)
        except ValueError as e:
            self._needs_reset = True
            raise EnvError(
                f"env {self.spec.name} returned from {where} observations that are {e}, at "
                f"step {t} of batch {batch_id}; its single observation space is "
                f"{self.obs_space!r}. Fix the env or its observation_space.") from None
        out = []
        for leaf, part in zip(self.obs_layout.leaves, parts):
            arr = np.asarray(part)
            expected = leaf.shape if rows is None else (rows, *leaf.shape)
            if arr.shape != expected or arr.dtype.kind not in "biuf":
                self._needs_reset = True
                what = (f"observations whose {leaf.label('observation')} has" if leaf.path
                        else "observations of")
                raise EnvError(
                    f"env {self.spec.name} returned from {where} {what} shape {arr.shape} "
                    f"and dtype {arr.dtype} at step {t} of batch {batch_id}; its single "
                    f"observation space {self.obs_space!r} says shape {expected} for "
                    f"{rows or 'one'} sub-env{'s' if rows else ''}, dtype {leaf.dtype}. Fix the "
                    "env or its observation_space."
                )
            out.append(arr)
        return out

    def _set_obs(self, leaves: list[np.ndarray], mask: np.ndarray | None = None) -> None:
        """Make ``leaves`` the current observations (of the masked sub-envs only)."""
        for cur, new in zip(self.obs, leaves):
            if mask is None:
                cur[...] = new
            else:
                cur[mask] = new

    def _reset_all(self, batch_id: int) -> None:
        seed = self._first_seed if self._first_reset else None
        try:
            obs, _ = self.venv.reset(seed=seed)
        except Exception as e:
            raise self._raise_env(f"reset() at step 0 of batch {batch_id}", e) from e
        self._set_obs(self._check_obs(obs, self.n_envs, "reset()", 0, batch_id))
        self.episode_id[:] = episode_id_base(batch_id) + np.arange(self.n_envs)
        self.episode_step[:] = 0
        self.episode_return[:] = 0.0
        self._awaiting[:] = False
        self._carry, self._carry_n[:] = None, 0
        self._info_carry = []
        self._first_reset = self._needs_reset = False

    def _reset_some(self, mask: np.ndarray, t: int, batch_id: int) -> list[np.ndarray]:
        """Reset the masked sub-envs alone; their first observations (leaves), in index
        order."""
        where = f"reset(options={{'reset_mask': ...}}) at step {t} of batch {batch_id}"
        try:
            obs, info = self.venv.reset(options={"reset_mask": mask.copy()})
        except Exception as e:
            raise self._raise_env(where, e) from e
        k = int(mask.sum())
        if self._rows(obs) == self.n_envs and k != self.n_envs:
            leaves = self._check_obs(obs, self.n_envs, where, t, batch_id)  # every sub-env's
            for arr, cur in zip(leaves, self.obs):
                if not np.array_equal(arr[~mask], cur[~mask], equal_nan=arr.dtype.kind == "f"):
                    self._needs_reset = True
                    raise EnvError(
                        f"env {self.spec.name}: {where} changed the observations of sub-envs "
                        f"outside the mask {np.flatnonzero(mask).tolist()}, so it reset them "
                        "too. daskrl resets ended sub-envs alone this way in autoreset mode "
                        f"{self.mode.value}; make the env reset only the masked sub-envs."
                    )
            return [arr[mask] for arr in leaves]
        leaves = self._check_obs(obs, k, where, t, batch_id)  # only theirs (envpool)
        ids = info.get("env_id") if isinstance(info, dict) else None
        if ids is not None and np.shape(ids) == (k,):
            order = np.argsort(np.asarray(ids), kind="stable")
            leaves = [arr[order] for arr in leaves]
        return leaves

    def _rows(self, obs: Any) -> int | None:
        """How many sub-envs' observations ``obs`` holds (its first leaf's length), or None
        where it does not have the space's structure (:meth:`_check_obs` says why)."""
        try:
            first = np.asarray(self.obs_layout.split(obs)[0])
        except ValueError:
            return None
        return first.shape[0] if first.ndim else None

    def _step(self, action: list[np.ndarray], t: int, batch_id: int, deadline: float | None
              ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, np.ndarray, Any]:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        actions = self.act_layout.join([vector_action(leaf.space, a)
                                        for leaf, a in zip(self.act_layout.leaves, action)])
        try:
            result = step_vector(self.venv, actions, timeout)
        except Exception as e:
            if is_timeout(e):
                self._broken = True
                raise self._timeout(batch_id, t) from e
            raise self._raise_env(f"step() at step {t} of batch {batch_id}", e) from e
        try:
            obs, reward, terminated, truncated, info = result
        except (TypeError, ValueError):
            self._needs_reset = True
            raise EnvError(f"env {self.spec.name} returned from step() {type(result).__name__} "
                           "instead of (obs, reward, terminated, truncated, info).") from None
        E, name = self.n_envs, self.spec.name
        leaves = self._check_obs(obs, E, "step()", t, batch_id)
        return (leaves, check_batch(name, "reward", reward, E, "f"),
                check_batch(name, "terminated", terminated, E, "b"),
                check_batch(name, "truncated", truncated, E, "b"), info)

    def _timeout(self, batch_id: int, t: int) -> BatchTimeoutError:
        return BatchTimeoutError(
            f"batch {batch_id} ran past its deadline of {self._batch_timeout:g}s at step {t} "
            f"(env {self.spec.name}); it was stopped and its partial data discarded. Raise "
            "batch_timeout or lower frames_per_batch."
        )

    def _final_obs(self, info: Any, done: np.ndarray, t: int, batch_id: int
                   ) -> list[np.ndarray]:
        """SAME_STEP: the true final observations of the sub-envs that ended."""
        idx = np.flatnonzero(done)
        for key in ("final_obs", "final_observation"):  # gymnasium >= 1.0, and before
            values = info.get(key) if isinstance(info, dict) else None
            if values is not None:
                mask = info.get(f"_{key}")
                break
        else:
            values = mask = None
        for i in idx.tolist():
            if values is None or (mask is not None and not mask[i]):
                self._needs_reset = True
                raise EnvError(
                    f"env {self.spec.name} (env index {i}) ended an episode at step {t} of "
                    f"batch {batch_id}, but its vector env, in autoreset mode SAME_STEP, gave "
                    "no info['final_obs'] for it: the final observation is lost. Fix the env "
                    "(or declare its metadata['autoreset_mode'] as it behaves)."
                )
        assert values is not None  # checked above
        where = "step() (info['final_obs'])"
        finals = [self._check_obs(_row(values, i), None, where, t, batch_id)
                  for i in idx.tolist()]
        return [np.stack([f[j] for f in finals]) for j in range(len(self.obs))]

    # -- the policy ---------------------------------------------------------------------------
    def _act(self, policy: torch.nn.Module, device: torch.device, first: bool, t: int,
             batch_id: int) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
        """The policy's actions (one array ``[E, ...]`` per leaf of the action space) and
        extra outputs."""
        # On CPU the policy reads the observation in place (unchanged until it has returned).
        obs_t = self.obs_layout.join([
            torch.from_numpy(cur) if device.type == "cpu" else torch.as_tensor(cur, device=device)
            for cur in self.obs])
        try:
            with torch.inference_mode():
                out = policy(obs_t)
        except Exception as e:
            raise policy_error(e, self.spec.name, t, batch_id, obs_t) from e
        if first or self._read is None:
            self._read = OutputReader(out, self.act_space, self.n_envs, self.spec.name)
        return self._read(out)

    def _random(self, action: list[np.ndarray], mask: np.ndarray) -> list[np.ndarray]:
        """``action`` with the masked columns' actions sampled from their own action spaces
        (seeded as single envs' are)."""
        action = [a.copy() for a in action]
        for i in np.flatnonzero(mask).tolist():
            sample = self.act_layout.split(self._action_spaces[i].sample())
            for a, v in zip(action, sample):
                a[i] = np.asarray(v).astype(a.dtype, copy=False).reshape(a.shape[1:])
        return action

    # -- a batch ------------------------------------------------------------------------------
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
        """Step the vector env until each sub-env has made ``steps`` real transitions; return
        ``(arrays [T, E, ...], stats)`` as :meth:`EnvSet.collect`."""
        if reset or self._needs_reset:
            self._reset_all(batch_id)
        self._batch_timeout = batch_timeout
        deadline = None if batch_timeout is None else time.monotonic() + batch_timeout
        t0 = time.perf_counter()
        recorder = InfoRecorder(self.info_keys, steps, self.n_envs, env_name=self.spec.name,
                                batch_id=batch_id, specs=self.info_specs)
        run = self._run_staggered if self.staggered else self._run_aligned
        out, returns, lengths = run(policy, device, steps, batch_id, random_steps, deadline,
                                    recorder)
        if self.episode_step.max() >= self.spec.endless_episode_steps:
            i = int(self.episode_step.argmax())
            raise EnvError(
                f"env {self.spec.name} (env index {i}) has run an episode of "
                f"{int(self.episode_step[i])} steps without terminating or truncating. Give "
                "its sub-envs a time limit."
            )
        elapsed = time.perf_counter() - t0
        if (err := non_finite_error(out, self.obs_layout, self.spec.name, batch_id)) is not None:
            self._needs_reset = True
            raise err
        out.update(recorder.arrays())
        self.last_batch_id = batch_id
        return out, {"episode_returns": tuple(returns), "episode_lengths": tuple(lengths),
                     "episode_stats": tuple(recorder.episodes), "rollout_seconds": elapsed}

    def _record_info(self, recorder: InfoRecorder, rows: int | np.ndarray, info: Any,
                     done: np.ndarray, envs: np.ndarray | None = None) -> None:
        """Record one vector step's ``info`` for the sub-envs ``envs`` (default: all) at
        ``rows``; ``done``: the sub-envs whose episode ended at this step. In ``SAME_STEP``
        mode an ended sub-env's entries are those of ``info["final_info"]`` (``info`` holds
        its reset's), and its episode statistics those of ``final_info`` or, from a vector
        ``RecordEpisodeStatistics``, of ``info``."""
        if not isinstance(info, Mapping) or (not self.info_keys and not done.any()):
            return
        idx = np.arange(self.n_envs) if envs is None else envs
        final = info.get("final_info") if self.mode is AutoresetMode.SAME_STEP else None
        if not isinstance(final, Mapping) or not done[idx].any():
            recorder.record(rows, info, envs=idx, done=done)
            return
        ended, live = idx[done[idx]], idx[~done[idx]]
        recorder.record(rows, info, envs=live)
        recorder.record(rows, final, envs=ended, done=done)
        if EPISODE_KEY not in final and EPISODE_KEY in info:  # a vector env's own statistics
            stats = {k: info[k] for k in (EPISODE_KEY, "_" + EPISODE_KEY) if k in info}
            recorder.record(rows, stats, envs=ended, done=done)

    def _run_aligned(self, policy: torch.nn.Module, device: torch.device, steps: int,
                     batch_id: int, random_steps: int, deadline: float | None,
                     recorder: InfoRecorder) -> tuple[
                         dict[str, np.ndarray], list[float], list[int]]:
        """Every step a real one for every sub-env: row ``t`` of the batch is step ``t``."""
        E = self.n_envs
        out = self._new_grid(steps)
        returns: list[float] = []
        lengths: list[int] = []
        same_step = self.mode is AutoresetMode.SAME_STEP
        everyone = np.ones(E, np.bool_)
        obs_bufs = [out[n] for n in self.obs_names]
        next_bufs = [out[n] for n in self.next_names]
        act_bufs: list[np.ndarray] = []
        rewards_out, term_out, trunc_out = out["reward"], out["terminated"], out["truncated"]
        # Each sub-env's episode: the row it started at (negative: before this batch); the
        # batch's episode_id and step are derived at its end from where episodes started.
        carried_ids, carried_steps = self.episode_id.copy(), self.episode_step.copy()
        start_row = -carried_steps
        starts: list[tuple[int, int]] = []
        for t in range(steps):
            for buf, cur in zip(obs_bufs, self.obs):
                buf[t] = cur
            action, extras = self._act(policy, device, t == 0, t, batch_id)
            if t == 0:
                self._add_policy_arrays(out, action, extras)
                act_bufs = [out[n] for n in self.act_names]
            for k, v in extras.items():
                out[k][t] = v
            if t < random_steps:
                action = self._random(action, everyone)
            for buf, a in zip(act_bufs, action):
                buf[t] = a
            nobs, reward, terminated, truncated, info = self._step(action, t, batch_id, deadline)
            done = terminated | truncated
            ended = bool(done.any())
            for buf, v in zip(next_bufs, nobs):
                buf[t] = v
            self._set_obs(nobs)
            if ended:
                if same_step:  # nobs holds the next episodes' first observations
                    for buf, v in zip(next_bufs, self._final_obs(info, done, t, batch_id)):
                        buf[t][done] = v
                else:
                    self._set_obs(self._reset_some(done, t, batch_id), done)
            if ended or self.info_keys:
                self._record_info(recorder, t, info, done)
            rewards_out[t] = reward
            term_out[t] = terminated
            trunc_out[t] = truncated
            self.episode_return += reward
            if ended:
                idx = np.flatnonzero(done)
                returns.extend(self.episode_return[idx].tolist())
                lengths.extend((t + 1 - start_row[idx]).tolist())
                start_row[idx] = t + 1
                starts.extend((t + 1, i) for i in idx.tolist())
                self.episode_id[idx] = episode_id_base(batch_id) + (t + 1) * E + idx
                self.episode_return[idx] = 0.0
            if deadline is not None and time.monotonic() > deadline:
                raise self._timeout(batch_id, t)
        out["episode_id"][:], out["step"][:] = episode_columns(
            steps, E, episode_id_base(batch_id), carried_ids, carried_steps, starts)
        self.episode_step[:] = steps - start_row
        return dict(out.arrays), returns, lengths


def _row(values: Any, i: int) -> Any:
    """Sub-env ``i``'s entry of a vector info value: an object array's ``i``-th, or, for a
    dict of them (gymnasium's form of a ``Dict`` observation), the dict of ``i``-th ones."""
    if isinstance(values, Mapping):
        return {k: _row(v, i) for k, v in values.items() if not str(k).startswith("_")}
    return values[i]


def make_envset(spec: EnvSpec, n_envs: int, seed: int, stream: int,
                restart: tuple[int, ...] = (), info_keys: tuple[str, ...] = ()
                ) -> EnvSet | VectorEnvSet:
    """The stream's envs: a :class:`VectorEnvSet` for a vector env, an :class:`EnvSet` of
    single envs otherwise."""
    if spec.is_vector:
        return VectorEnvSet(spec, n_envs, seed, stream, restart, info_keys=info_keys)
    return EnvSet(spec, n_envs, seed, stream, restart, info_keys=info_keys)
