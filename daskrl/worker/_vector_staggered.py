"""Vector envs that can neither reset one sub-env nor skip the reset step: columns that fill at
their own pace.

In ``NEXT_STEP`` mode the step after an episode's end resets the sub-env and ignores its
action; a vector env that cannot reset its ended sub-envs alone
(:func:`~daskrl.worker._vector_envs.resets_one`: ``vector_entry_point`` envs, most
``VectorEnv`` subclasses) has to be stepped through it. That step is not a transition and is not
stored, so each sub-env loses a vector step per episode and the columns of a batch fall out of
step: :class:`StaggeredLoop` steps the vector env until every column holds its ``T``
transitions, and what a column made past ``T`` (its *spill*) opens the stream's next batch.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from daskrl.errors import EnvError, PolicyError
from daskrl.store._layout import UNUSED_EPISODE_IDS, episode_id_base
from daskrl.worker._episodes import Episodes
from daskrl.worker._infos import InfoRecorder
from daskrl.worker._policy_output import OutputReader, policy_error, to_numpy
from daskrl.worker._recurrent import PolicyState, state_names
from daskrl.worker._vector import VectorEnvs

__all__ = ["Grid", "StaggeredLoop"]

_Snap = tuple[np.ndarray, np.ndarray, list[torch.Tensor]]
"""A recurrent policy's state before some columns' steps: their rows, the columns, and the
state's rows of those columns (one tensor per leaf)."""

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


class StaggeredLoop:
    """The rollout of a vector env whose columns fill at their own pace, with what it keeps
    between batches (the columns awaiting their reset step, and their spill)."""

    def __init__(self, envs: VectorEnvs, episodes: Episodes) -> None:
        self.envs = envs
        self.episodes = episodes
        E = self.n_envs = envs.n_envs
        self.obs_names = envs.obs_layout.names("observation")
        self.next_names = envs.obs_layout.names("next_observation")
        self.act_names = envs.act_layout.names("action")
        self._awaiting = np.zeros(E, np.bool_)
        """Columns whose next step is the env's reset step."""
        self._carry: dict[str, np.ndarray] | None = None
        """What columns made past the last batch, for the next (``[K, E, ...]``)."""
        self._carry_n = np.zeros(E, np.int64)
        self._info_carry: list[tuple[np.ndarray, Any, np.ndarray, np.ndarray]] = []
        """The infos of the carried rows, ``(rows, info, envs, done)`` per step."""
        self._read: OutputReader | None = None
        """Reads the policy's outputs; made from each batch's first."""
        self._state_carry: list[_Snap] = []
        """A recurrent policy's state before the carried rows that open a later batch."""

    def restart(self) -> None:
        """Every sub-env was reset: nothing awaits a reset step, nothing is carried."""
        self._awaiting[:] = False
        self._carry, self._carry_n[:] = None, 0
        self._info_carry = []
        self._state_carry = []

    def _act(self, policy: Any, device: torch.device, t: int, batch_id: int
             ) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
        """The policy's actions (one array ``[E, ...]`` per leaf of the action space) and
        extra outputs."""
        envs = self.envs
        # On CPU the policy reads the observation in place (unchanged until it has returned).
        obs_t = envs.obs_layout.join([
            torch.from_numpy(cur) if device.type == "cpu" else torch.as_tensor(cur, device=device)
            for cur in envs.obs])
        try:
            with torch.inference_mode():
                out = policy(obs_t)
        except PolicyError:
            raise
        except Exception as e:
            raise policy_error(e, envs.spec.name, t, batch_id, obs_t) from e
        if t == 0 or self._read is None:
            self._read = OutputReader(out, envs.act_space, self.n_envs, envs.spec.name)
        return self._read(out)

    def _new_grid(self, steps: int) -> Grid:
        grid = Grid(steps, self.n_envs)
        for names in (self.obs_names, self.next_names):
            for name, cur in zip(names, self.envs.obs):
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

    def run(self, policy: Any, device: torch.device, steps: int, batch_id: int,
            random_steps: int, deadline: float | None, recorder: InfoRecorder,
            rec: PolicyState | None = None) -> dict[str, np.ndarray]:
        """A batch's arrays ``[steps, E, ...]``: each column has its own cursor, the env's
        reset steps are skipped, and what a column makes past ``steps`` is kept for the
        stream's next batch.

        Each vector step is recorded as one row (as in the aligned loop), with the columns'
        cursors and which of them made a real step; the rows are put in their columns' places
        at the end, one scatter per array. ``policy``: a stateless one (a recurrent policy
        bound to its state ``rec``, whose rows are reset for the columns whose next episode
        begins). A column's first row may have been made in a batch before, and the next
        batch's length is not known yet, so the state before each row of a column's spill
        (any of which may open a later batch) is kept with the row, and the state before its
        row 0 is stored; in ``every_step`` mode the state before every step is recorded with
        its row."""
        E = self.n_envs
        grid = self._new_grid(steps)
        grid.add(_RET, (), np.float64, 0.0)
        grid.add(_LEN, (), np.int64, -1)
        envs, episodes = self.envs, self.episodes
        episodes.begin(batch_id)
        cursor = self._place_carry(grid, steps, batch_id)
        raw = self._new_grid(steps + 8)  # one row per vector step
        raw.add("__row", (), np.int64)
        raw.add("__real", (), np.bool_)
        spilled_ends: list[tuple[int, int, float, int]] = []
        infos: list[tuple[np.ndarray, Any, np.ndarray, np.ndarray]] = []
        """Each vector step's info, with its columns' rows, real columns and ended ones."""
        every = rec is not None and rec.every_step
        state_keys = state_names(rec.spec) if rec is not None else []
        snaps = self._state_carry if rec is not None and not every else None
        self._state_carry = []
        for key, leaf in zip(state_keys, rec.leaves() if rec is not None and every else []):
            for g in (grid, raw):
                if key not in g.arrays:
                    g.add(key, tuple(leaf.shape[1:]), to_numpy(leaf[:1]).dtype)
        # A column's cursor moves a row per step at most, so before step ``quiet`` no column
        # reaches its spill, and a column's row 0 is made at t = 0 (t = 1 after a reset step).
        quiet = steps - int(cursor.max())
        skip = max(quiet, 2) - 2
        hist = (self._history(rec.leaves(), 2 + int(cursor.max()) + steps // 8 + 8)
                if rec is not None and not every else [])
        """The state before each vector step that may make a row 0 or a spilled row: steps
        0 and 1, then from ``quiet`` on (step ``t`` at ``t - skip``)."""
        t = 0
        while cursor.min() < steps:
            raw.ensure(t + 1)
            for name, cur in zip(self.obs_names, envs.obs):
                raw[name][t] = cur
            raw["episode_id"][t] = episodes.id
            raw["step"][t] = episodes.step
            if rec is None:
                pass
            elif every:
                for key, leaf in zip(state_keys, rec.leaves()):
                    raw[key][t] = to_numpy(leaf)
            elif hist and (t < 2 or t >= quiet):
                at = t - skip if t >= 2 else t
                if at == hist[0].shape[0]:
                    hist = [torch.cat([h, torch.empty_like(h)]) for h in hist]
                for h, leaf in zip(hist, rec.leaves()):
                    h[at].copy_(leaf)
            action, extras = self._act(policy, device, t, batch_id)
            if t == 0:
                self._add_policy_arrays(grid, action, extras)
                self._add_policy_arrays(raw, action, extras)
            resetting = bool(self._awaiting.any())  # the env's reset step for some columns
            real = ~self._awaiting
            if random_steps:
                random = real & (cursor < random_steps)
                if random.any():
                    action = envs.act_layout.sample(action, np.flatnonzero(random).tolist(),
                                                    envs.action_spaces)
            for k, v in extras.items():
                raw[k][t] = v
            for name, a in zip(self.act_names, action):
                raw[name][t] = a
            nobs, reward, terminated, truncated, info = envs.raw_step(action, t, batch_id,
                                                                      deadline)
            if resetting:
                self._begin_episodes(self._awaiting, cursor, steps, batch_id, reward,
                                     terminated | truncated, t)
                if rec is not None:
                    rec.reset(np.flatnonzero(self._awaiting))
            for name, v in zip(self.next_names, nobs):
                raw[name][t] = v
            raw["reward"][t] = reward
            raw["terminated"][t] = terminated
            raw["truncated"][t] = truncated
            raw["__row"][t] = cursor
            raw["__real"][t] = real
            if not resetting:
                episodes.ret += reward
                episodes.step += 1
                done = terminated | truncated
            else:
                episodes.ret[real] += reward[real]
                episodes.step[real] += 1
                done = real & (terminated | truncated)
            if info and (recorder.keys or done.any()):
                infos.append((cursor.copy(), info, np.flatnonzero(real), done.copy()))
            if done.any():
                for i in np.flatnonzero(done).tolist():
                    ret, n = float(episodes.ret[i]), int(episodes.step[i])
                    if cursor[i] < steps:
                        episodes.ended(ret, n)
                    else:  # reported with the batch this row goes to
                        spilled_ends.append((int(cursor[i]), i, ret, n))
            cursor += real
            self._awaiting = done
            envs.set_obs(nobs)
            t += 1
            if deadline is not None and time.monotonic() > deadline:
                raise envs.timeout(batch_id, t)
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
        if snaps is not None:
            if hist:
                snaps.append(self._spill_state(hist, skip, raw, t, steps))
            out.update(self._first_state(snaps, state_keys, steps))
        return out

    @staticmethod
    def _history(leaves: list[torch.Tensor], rows: int) -> list[torch.Tensor]:
        """Buffers ``[rows, E, ...]`` for the state before each of ``rows`` vector steps."""
        return [torch.empty((rows, *leaf.shape), dtype=leaf.dtype, device=leaf.device)
                for leaf in leaves]

    @staticmethod
    def _spill_state(hist: list[torch.Tensor], skip: int, raw: Grid, t: int, steps: int
                     ) -> _Snap:
        """The state before each column's row 0 and spilled rows made in the ``t`` vector
        steps recorded in ``raw``, from the history ``hist`` (step ``s >= 2`` at
        ``s - skip``)."""
        rows = raw["__row"][:t]
        ts, cs = np.nonzero(raw["__real"][:t] & ((rows == 0) | (rows >= steps)))
        if not ts.size:
            return rows[ts, cs], cs, [h[:0, 0] for h in hist]
        at = np.where(ts >= 2, ts - skip, ts)
        index = torch.from_numpy(at).to(hist[0].device), torch.from_numpy(cs).to(hist[0].device)
        return rows[ts, cs], cs, [h[index] for h in hist]

    def _first_state(self, snaps: list[_Snap], keys: list[str], steps: int
                     ) -> dict[str, np.ndarray]:
        """The state before each column's row 0 (``[E, ...]`` per key); the snapshots of rows
        past ``steps`` are kept, with rows counted from the next batch's start."""
        first: dict[str, np.ndarray] = {}
        for rows, cols, leaves in snaps:
            here = np.flatnonzero(rows == 0)
            for key, leaf in zip(keys, leaves):
                if here.size:
                    part = to_numpy(leaf[here])
                    if key not in first:
                        first[key] = np.zeros((self.n_envs, *part.shape[1:]), part.dtype)
                    first[key][cols[here]] = part
            later = np.flatnonzero(rows >= steps)
            if later.size:
                self._state_carry.append((rows[later] - steps, cols[later],
                                          [leaf[later] for leaf in leaves]))
        return first

    def _record_infos(self, recorder: InfoRecorder,
                      infos: list[tuple[np.ndarray, Any, np.ndarray, np.ndarray]],
                      steps: int) -> None:
        """Record each vector step's info for its real columns at their rows; what rows past
        ``steps`` hold is kept for the stream's next batch, with the rows they carry to."""
        carry = []
        for rows, info, real, done in infos:
            inside = rows[real] < steps
            if inside.any():
                self.envs.record_info(recorder, rows, info, done, envs=real[inside])
            if not inside.all():
                carry.append((rows - steps, info, real[~inside], done))
        self._info_carry = carry

    def _begin_episodes(self, mask: np.ndarray, cursor: np.ndarray, steps: int, batch_id: int,
                        reward: np.ndarray, done: np.ndarray, t: int) -> None:
        """The env's reset step for the masked columns: their next episodes begin. An id
        names the batch and row where the episode's first transition is stored; one that
        will be stored in a later batch gets ``-(1 + row in the carry)`` until then."""
        bad = mask & ((reward != 0) | done)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise EnvError(
                f"env {self.envs.spec.name} (env index {i}) returned reward={float(reward[i])!r} "
                f"terminated/truncated={bool(done[i])} at step {t} of batch {batch_id}, the "
                "step after its episode ended: in autoreset mode NEXT_STEP (its "
                "metadata['autoreset_mode'], or gymnasium's default) that step resets the "
                "sub-env, with reward 0 and no end. Declare the mode the env has."
            )
        idx = np.flatnonzero(mask)
        c = cursor[idx]
        episodes = self.episodes
        episodes.id[idx] = np.where(
            c <= steps, episode_id_base(batch_id) + c * self.n_envs + idx, -(1 + c - steps))
        episodes.step[idx] = 0
        episodes.ret[idx] = 0.0

    def _keep_carry(self, grid: Grid, steps: int, cursor: np.ndarray) -> None:
        self._carry_n = cursor - steps
        k = int(self._carry_n.max())
        self._carry = {key: v[steps:steps + k].copy() for key, v in grid.arrays.items()} if k else None

    def _place_carry(self, grid: Grid, steps: int, batch_id: int) -> np.ndarray:
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
            for ret, n in zip(grid[_RET][ended, i].tolist(), grid[_LEN][ended, i].tolist()):
                self.episodes.ended(ret, n)
            grid[_LEN][:min(m, steps), i] = -1  # reported
        self._fix_ids(self.episodes.id, np.arange(self.n_envs), steps, batch_id)
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
