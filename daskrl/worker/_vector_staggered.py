"""Vector envs that can neither reset one sub-env nor skip the reset step: columns that fill at
their own pace.

In ``NEXT_STEP`` mode the step after an episode's end resets the sub-env and ignores its
action; a vector env that cannot reset its ended sub-envs alone
(:func:`~daskrl.worker._vector_envs.resets_one`: ``vector_entry_point`` envs, most
``VectorEnv`` subclasses) has to be stepped through it. That step is not a transition and is not
stored, so each sub-env loses a vector step per episode and the columns of a batch fall out of
step: :class:`StaggeredSteps` steps the vector env until every column holds its ``T``
transitions, and what a column made past ``T`` (its *spill*) opens the stream's next batch.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from daskrl.errors import BatchTimeoutError, EnvError
from daskrl.store._layout import UNUSED_EPISODE_IDS, episode_id_base
from daskrl.worker._infos import InfoRecorder

__all__ = ["Grid", "StaggeredSteps"]

_RET, _LEN = "__return", "__length"
"""Rows of a column's spill that end an episode: its return and length, reported with the
batch the row is stored in."""


class Grid:
    """A batch's arrays ``[rows, E, ...]`` that grow past ``T`` rows as columns run ahead."""

    def __init__(self, rows: int, n_envs: int) -> None:
        self.rows, self.n_envs = rows, n_envs
        self.arrays: dict[str, np.ndarray] = {}

    def add(self, key: str, row_shape: tuple[int, ...], dtype: Any, fill: Any = None) -> None:
        shape = (self.rows, self.n_envs, *row_shape)
        self.arrays[key] = np.empty(shape, dtype) if fill is None else np.full(shape, fill, dtype)

    def ensure(self, rows: int) -> None:
        if rows <= self.rows:
            return
        grow = max(rows, self.rows + self.rows // 4 + 8)
        for key, arr in self.arrays.items():
            more = np.full((grow - self.rows, *arr.shape[1:]), -1 if key == _LEN else 0, arr.dtype)
            self.arrays[key] = np.concatenate([arr, more])
        self.rows = grow

    def __getitem__(self, key: str) -> np.ndarray:
        return self.arrays[key]


class StaggeredSteps:
    """The staggered rollout of :class:`~daskrl.worker._vector.VectorEnvSet` (its state and
    its checked calls to the env and the policy are the env set's)."""

    n_envs: int
    obs: list[np.ndarray]
    obs_names: list[str]
    next_names: list[str]
    act_names: list[str]
    info_keys: tuple[str, ...]
    _info_carry: list[tuple[np.ndarray, Any, np.ndarray, np.ndarray]]
    episode_id: np.ndarray
    episode_step: np.ndarray
    episode_return: np.ndarray
    spec: Any
    _awaiting: np.ndarray
    _carry: dict[str, np.ndarray] | None
    _carry_n: np.ndarray
    _needs_reset: bool

    def _act(self, policy: torch.nn.Module, device: torch.device, first: bool, t: int,
             batch_id: int) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
        raise NotImplementedError

    def _random(self, action: list[np.ndarray], mask: np.ndarray) -> list[np.ndarray]:
        raise NotImplementedError

    def _step(self, action: list[np.ndarray], t: int, batch_id: int, deadline: float | None
              ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, np.ndarray, Any]:
        raise NotImplementedError

    def _set_obs(self, leaves: list[np.ndarray], mask: np.ndarray | None = None) -> None:
        raise NotImplementedError

    def _record_info(self, recorder: InfoRecorder, rows: int | np.ndarray, info: Any,
                     done: np.ndarray, envs: np.ndarray | None = None) -> None:
        raise NotImplementedError

    def _timeout(self, batch_id: int, t: int) -> BatchTimeoutError:
        raise NotImplementedError

    def _new_grid(self, steps: int) -> Grid:
        grid = Grid(steps, self.n_envs)
        for names in (self.obs_names, self.next_names):
            for name, cur in zip(names, self.obs):
                grid.add(name, cur.shape[1:], cur.dtype)
        grid.add("reward", (), np.float32)
        grid.add("terminated", (), np.bool_)
        grid.add("truncated", (), np.bool_)
        grid.add("episode_id", (), np.int64)
        grid.add("step", (), np.int64)
        return grid

    def _add_policy_arrays(self, grid: Grid, action: list[np.ndarray],
                           extras: dict[str, np.ndarray]) -> None:
        for name, a in zip(self.act_names, action):
            if name not in grid.arrays:
                grid.add(name, a.shape[1:], a.dtype)
        for k, v in extras.items():
            if k not in grid.arrays:
                grid.add(k, v.shape[1:], v.dtype)

    def _run_staggered(self, policy: torch.nn.Module, device: torch.device, steps: int,
                       batch_id: int, random_steps: int, deadline: float | None,
                       recorder: InfoRecorder) -> tuple[
                           dict[str, np.ndarray], list[float], list[int]]:
        """NEXT_STEP without resetting sub-envs alone: each column has its own cursor, the
        env's reset steps are skipped, and what a column makes past ``steps`` is kept for the
        stream's next batch.

        Each vector step is recorded as one row (as in :meth:`_run_aligned`), with the
        columns' cursors and which of them made a real step; the rows are put in their
        columns' places at the end, one scatter per array."""
        E = self.n_envs
        grid = self._new_grid(steps)
        grid.add(_RET, (), np.float64, 0.0)
        grid.add(_LEN, (), np.int64, -1)
        returns: list[float] = []
        lengths: list[int] = []
        cursor = self._place_carry(grid, steps, batch_id, returns, lengths)
        raw = self._new_grid(steps + 8)  # one row per vector step
        raw.add("__row", (), np.int64)
        raw.add("__real", (), np.bool_)
        spilled_ends: list[tuple[int, int, float, int]] = []
        infos: list[tuple[np.ndarray, Any, np.ndarray, np.ndarray]] = []
        """Each vector step's info, with its columns' rows, real columns and ended ones."""
        t = 0
        while cursor.min() < steps:
            raw.ensure(t + 1)
            for name, cur in zip(self.obs_names, self.obs):
                raw[name][t] = cur
            raw["episode_id"][t] = self.episode_id
            raw["step"][t] = self.episode_step
            action, extras = self._act(policy, device, t == 0, t, batch_id)
            if t == 0:
                self._add_policy_arrays(grid, action, extras)
                self._add_policy_arrays(raw, action, extras)
            resetting = bool(self._awaiting.any())  # the env's reset step for some columns
            real = ~self._awaiting
            if random_steps:
                random = real & (cursor < random_steps)
                if random.any():
                    action = self._random(action, random)
            for k, v in extras.items():
                raw[k][t] = v
            for name, a in zip(self.act_names, action):
                raw[name][t] = a
            nobs, reward, terminated, truncated, info = self._step(action, t, batch_id, deadline)
            if resetting:
                self._begin_episodes(self._awaiting, cursor, steps, batch_id, reward,
                                     terminated | truncated, t)
            for name, v in zip(self.next_names, nobs):
                raw[name][t] = v
            raw["reward"][t] = reward
            raw["terminated"][t] = terminated
            raw["truncated"][t] = truncated
            raw["__row"][t] = cursor
            raw["__real"][t] = real
            if not resetting:
                self.episode_return += reward
                self.episode_step += 1
                done = terminated | truncated
            else:
                self.episode_return[real] += reward[real]
                self.episode_step[real] += 1
                done = real & (terminated | truncated)
            if info and (self.info_keys or done.any()):
                infos.append((cursor.copy(), info, np.flatnonzero(real), done.copy()))
            if done.any():
                for i in np.flatnonzero(done).tolist():
                    ret, n = float(self.episode_return[i]), int(self.episode_step[i])
                    if cursor[i] < steps:
                        returns.append(ret)
                        lengths.append(n)
                    else:  # reported with the batch this row goes to
                        spilled_ends.append((int(cursor[i]), i, ret, n))
            cursor += real
            self._awaiting = done
            self._set_obs(nobs)
            t += 1
            if deadline is not None and time.monotonic() > deadline:
                raise self._timeout(batch_id, t)
        # Each real step to its column's row: rows past ``steps`` are the spill.
        real = raw["__real"][:t]
        rows = raw["__row"][:t][real]
        cs = np.broadcast_to(np.arange(E), real.shape)[real]
        grid.ensure(int(cursor.max()))
        for key, arr in raw.arrays.items():
            if key not in ("__row", "__real"):
                grid[key][rows, cs] = arr[:t][real]
        for row, i, ret, n in spilled_ends:
            grid[_RET][row, i] = ret
            grid[_LEN][row, i] = n
        self._keep_carry(grid, steps, cursor)
        self._record_infos(recorder, self._info_carry + infos, steps)
        out = {k: v[:steps] for k, v in grid.arrays.items() if k not in (_RET, _LEN)}
        return out, returns, lengths

    def _record_infos(self, recorder: InfoRecorder,
                      infos: list[tuple[np.ndarray, Any, np.ndarray, np.ndarray]],
                      steps: int) -> None:
        """Record each vector step's info for its real columns at their rows; what rows past
        ``steps`` hold is kept for the stream's next batch, with the rows they carry to."""
        carry = []
        for rows, info, envs, done in infos:
            inside = rows[envs] < steps
            if inside.any():
                self._record_info(recorder, rows, info, done, envs=envs[inside])
            if not inside.all():
                carry.append((rows - steps, info, envs[~inside], done))
        self._info_carry = carry

    def _begin_episodes(self, mask: np.ndarray, cursor: np.ndarray, steps: int, batch_id: int,
                        reward: np.ndarray, done: np.ndarray, t: int) -> None:
        """The env's reset step for the masked columns: their next episodes begin. An id
        names the batch and row where the episode's first transition is stored; one that
        will be stored in a later batch gets ``-(1 + row in the carry)`` until then."""
        bad = mask & ((reward != 0) | done)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            self._needs_reset = True
            raise EnvError(
                f"env {self.spec.name} (env index {i}) returned reward={float(reward[i])!r} "
                f"terminated/truncated={bool(done[i])} at step {t} of batch {batch_id}, the "
                "step after its episode ended: in autoreset mode NEXT_STEP (its "
                "metadata['autoreset_mode'], or gymnasium's default) that step resets the "
                "sub-env, with reward 0 and no end. Declare the mode the env has."
            )
        idx = np.flatnonzero(mask)
        c = cursor[idx]
        self.episode_id[idx] = np.where(
            c <= steps, episode_id_base(batch_id) + c * self.n_envs + idx, -(1 + c - steps))
        self.episode_step[idx] = 0
        self.episode_return[idx] = 0.0

    def _keep_carry(self, grid: Grid, steps: int, cursor: np.ndarray) -> None:
        self._carry_n = cursor - steps
        k = int(self._carry_n.max())
        self._carry = {key: v[steps:steps + k].copy() for key, v in grid.arrays.items()} if k else None

    def _place_carry(self, grid: Grid, steps: int, batch_id: int, returns: list[float],
                     lengths: list[int]) -> np.ndarray:
        """Put the transitions columns made past the last batch at the top of this one (those
        past this one's ``steps`` rows stay in its spill); the columns' cursors after them."""
        carry, have = self._carry, self._carry_n
        self._carry, self._carry_n = None, np.zeros(self.n_envs, np.int64)
        if carry is None:
            return np.zeros(self.n_envs, np.int64)
        grid.ensure(int(have.max()))
        for key, v in carry.items():
            if key not in grid.arrays:
                grid.add(key, v.shape[2:], v.dtype)
        for i in range(self.n_envs):
            m = int(have[i])
            for key, v in carry.items():
                grid[key][:m, i] = v[:m, i]
            self._fix_ids(grid["episode_id"][:m, i], i, steps, batch_id)
            ended = np.flatnonzero(grid[_LEN][:min(m, steps), i] >= 0)
            returns.extend(grid[_RET][ended, i].tolist())
            lengths.extend(grid[_LEN][ended, i].tolist())
            grid[_LEN][:min(m, steps), i] = -1  # reported
        self._fix_ids(self.episode_id, np.arange(self.n_envs), steps, batch_id)
        return have.copy()

    def _fix_ids(self, ids: np.ndarray, env: Any, steps: int, batch_id: int) -> None:
        """Name, in place, the episodes of ``ids`` (of column(s) ``env``) whose first row is
        in this batch; re-number the rest against the carry left after it."""
        pending = (ids < 0) & (ids >= UNUSED_EPISODE_IDS.start)
        if not pending.any():
            return
        row = -(ids + 1)
        env = np.broadcast_to(env, ids.shape)
        base = episode_id_base(batch_id)
        ids[:] = np.where(~pending, ids, np.where(row < steps, base + row * self.n_envs + env,
                                                  -(1 + row - steps)))
