"""One ``gymnasium.vector.VectorEnv`` as a stream's envs: its ``num_envs`` sub-envs are the ``E``.

The store holds the same data as from single envs (:mod:`daskrl.worker._single_envs`): only real
transitions, the true final ``next_observation`` at an episode's end, episode ids, steps,
returns and lengths by the same rules, ``Dict``/``Tuple`` spaces as one array per leaf
(:class:`~daskrl.worker._spaces.SpaceLayout`), and ``info_keys`` entries and
``RecordEpisodeStatistics`` episodes from the vector ``info`` (:mod:`daskrl.worker._infos`).
How that comes out of each autoreset mode:

Every mode but the last is stepped by the aligned loop (:mod:`daskrl.worker._rollout`):

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
import functools
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from daskrl.errors import BatchTimeoutError, EnvError
from daskrl.worker._batch import env_error, timeout_error
from daskrl.worker._envs import EnvSpec
from daskrl.worker._infos import EPISODE_KEY, InfoRecorder
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

__all__ = ["VectorEnvs"]


class VectorEnvs:
    """One stream's vector env, its calls checked."""

    def __init__(self, spec: EnvSpec, n_envs: int, seeds: list[int], vector_seed: int) -> None:
        self.spec = spec
        self.n_envs = n_envs
        self._seeds = seeds
        with building_seed(vector_seed):
            self.venv = spec.make_vector()
        self._broken = False
        self.batch_timeout: float | None = None
        """The batch's ``batch_timeout``, for the message of a step past its deadline."""
        try:
            self._setup(vector_seed)
        except BaseException:
            self.close()
            raise

    def _setup(self, vector_seed: int) -> None:
        venv, name, E = self.venv, self.spec.name, self.n_envs
        if venv.num_envs != E:
            raise EnvError(f"env {name} built a vector env of num_envs={venv.num_envs}; this "
                           f"collection has envs_per_worker={E}.")
        check_envpool(venv, name)
        self.obs_space = venv.single_observation_space
        self.act_space = venv.single_action_space
        self.mode = autoreset_mode(venv, name)
        self.same_step = self.mode is AutoresetMode.SAME_STEP
        # A Dict or Tuple space is one buffer per leaf (a flat space: one leaf).
        self.obs_layout = SpaceLayout(self.obs_space)
        self.act_layout = SpaceLayout(self.act_space)
        self.staggered = self.mode is AutoresetMode.NEXT_STEP and not resets_one(venv)
        """The env's own reset steps are skipped, and columns fill at their own pace."""
        self._first_seed = first_seed(venv, self._seeds, vector_seed)
        self._first_reset = True
        self.action_spaces = [copy.deepcopy(self.act_space) for _ in range(E)]
        """Each sub-env's action space, seeded as single envs' are (for random actions)."""
        for space, s in zip(self.action_spaces, self._seeds):
            space.seed(s)
        self.obs = [np.zeros((E, *leaf.shape), leaf.dtype) for leaf in self.obs_layout.leaves]
        """The sub-envs' current observations, one array ``[E, ...]`` per leaf of the space."""

    def close(self) -> None:
        """Close the vector env."""
        close_vector(self.venv, self._broken)

    # -- the env's calls, checked -------------------------------------------------------------
    def _where(self, e: BaseException) -> str:
        i = failed_index(self.venv, e)
        return f"env {self.spec.name} (env index {i})" if i is not None else (
            f"vector env {self.spec.name}")

    def _raise_env(self, what: str, e: Exception) -> EnvError:
        self._broken = True
        err = env_error(f"{self._where(e)} raised in {what}", e)
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
            raise EnvError(
                f"env {self.spec.name} returned from {where} observations that are {e}, at "
                f"step {t} of batch {batch_id}; its single observation space is "
                f"{self.obs_space!r}. Fix the env or its observation_space.") from None
        out = []
        for leaf, part in zip(self.obs_layout.leaves, parts):
            arr = np.asarray(part)
            expected = leaf.shape if rows is None else (rows, *leaf.shape)
            if arr.shape != expected or arr.dtype.kind not in "biuf":
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

    def set_obs(self, leaves: list[np.ndarray], mask: np.ndarray | None = None) -> None:
        """Make ``leaves`` the current observations (of the masked sub-envs only)."""
        for cur, new in zip(self.obs, leaves):
            if mask is None:
                cur[...] = new
            else:
                cur[mask] = new

    def reset_all(self, batch_id: int) -> None:
        """Reset every sub-env (the first time, with the first seeds)."""
        seed = self._first_seed if self._first_reset else None
        try:
            obs, _ = self.venv.reset(seed=seed)
        except Exception as e:
            raise self._raise_env(f"reset() at step 0 of batch {batch_id}", e) from e
        self.set_obs(self._check_obs(obs, self.n_envs, "reset()", 0, batch_id))
        self._first_reset = False

    def reset_ended(self, ended: list[int], t: int, batch_id: int) -> None:
        """Start the next episodes of the sub-envs ``ended``, whose episodes ended at step
        ``t``: reset them alone (in ``SAME_STEP`` mode the vector env has)."""
        if self.same_step:
            return
        mask = np.zeros(self.n_envs, np.bool_)
        mask[ended] = True
        self.set_obs(self._reset_some(mask, t, batch_id), mask)

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

    def raw_step(self, action: list[np.ndarray], t: int, batch_id: int, deadline: float | None
                 ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, np.ndarray, Any]:
        """One ``step`` of the vector env, checked: the observations' leaves ``[E, ...]``,
        rewards, terminated and truncated flags ``[E]``, and the info."""
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        actions = self.act_layout.join([vector_action(leaf.space, a)
                                        for leaf, a in zip(self.act_layout.leaves, action)])
        try:
            result = step_vector(self.venv, actions, timeout)
        except Exception as e:
            if is_timeout(e):
                self._broken = True
                raise self.timeout(batch_id, t) from e
            raise self._raise_env(f"step() at step {t} of batch {batch_id}", e) from e
        try:
            obs, reward, terminated, truncated, info = result
        except (TypeError, ValueError):
            raise EnvError(f"env {self.spec.name} returned from step() {type(result).__name__} "
                           "instead of (obs, reward, terminated, truncated, info).") from None
        E, name = self.n_envs, self.spec.name
        leaves = self._check_obs(obs, E, "step()", t, batch_id)
        return (leaves, check_batch(name, "reward", reward, E, "f"),
                check_batch(name, "terminated", terminated, E, "b"),
                check_batch(name, "truncated", truncated, E, "b"), info)

    def timeout(self, batch_id: int, t: int) -> BatchTimeoutError:
        """The error for a batch past its deadline at (vector) step ``t``."""
        return timeout_error(batch_id, self.batch_timeout, t, self.spec.name)

    def step(self, actions: list[np.ndarray], t: int, batch_id: int, deadline: float | None,
             next_obs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any, bool]:
        """Step every sub-env, as :meth:`SingleEnvs.step
        <daskrl.worker._single_envs.SingleEnvs.step>`: the stored next observations are the
        true final ones where an episode ended, and :attr:`obs` what the sub-envs show now."""
        nobs, reward, terminated, truncated, info = self.raw_step(actions, t, batch_id, deadline)
        for buf, v in zip(next_obs, nobs):
            buf[t] = v
        self.set_obs(nobs)
        done = terminated | truncated
        ended = bool(done.any())
        if ended and self.same_step:  # nobs holds the next episodes' first observations
            for buf, v in zip(next_obs, self._final_obs(info, done, t, batch_id)):
                buf[t][done] = v
        return reward, terminated, truncated, info, ended

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

    def info_recorders(self, recorder: InfoRecorder
                       ) -> tuple[Callable[..., None], Callable[..., None]]:
        """``record(t, info, done=...)``, which records one vector step's info, and
        ``record_ends(ended, info, t)``, which records it where the sub-envs ``ended`` ended
        their episodes at step ``t`` (for a batch without ``info_keys``)."""
        def record_ends(ended: list[int], info: Any, t: int) -> None:
            done = np.zeros(self.n_envs, np.bool_)
            done[ended] = True
            self.record_info(recorder, t, info, done)

        return functools.partial(self.record_info, recorder), record_ends

    def record_info(self, recorder: InfoRecorder, rows: int | np.ndarray, info: Any,
                    done: np.ndarray, envs: np.ndarray | None = None) -> None:
        """Record one vector step's ``info`` for the sub-envs ``envs`` (default: all) at
        ``rows``; ``done``: the sub-envs whose episode ended at this step. In ``SAME_STEP``
        mode an ended sub-env's entries are those of ``info["final_info"]`` (``info`` holds
        its reset's), and its episode statistics those of ``final_info`` or, from a vector
        ``RecordEpisodeStatistics``, of ``info``."""
        if not isinstance(info, Mapping) or (not recorder.keys and not done.any()):
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


def _row(values: Any, i: int) -> Any:
    """Sub-env ``i``'s entry of a vector info value: an object array's ``i``-th, or, for a
    dict of them (gymnasium's form of a ``Dict`` observation), the dict of ``i``-th ones."""
    if isinstance(values, Mapping):
        return {k: _row(v, i) for k, v in values.items() if not str(k).startswith("_")}
    return values[i]


