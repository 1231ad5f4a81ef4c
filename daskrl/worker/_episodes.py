"""Episode bookkeeping of a stream's ``E`` envs: ids, steps, returns, and the episodes a batch
ended.

Every rollout loop keeps its episodes here, so that ids, lengths and returns follow one set of
rules: an episode's id names the batch and the row ``t`` of its first transition and its env
``i`` (``episode_id_base(batch_id) + t * E + i``, :mod:`daskrl.store._layout`), its steps count
from 0, and its return is the float64 sum of the env's own rewards.
"""

from __future__ import annotations

import numpy as np

from daskrl.errors import EnvError
from daskrl.store._layout import episode_id_base

__all__ = ["ENDLESS_ADVICE", "Episodes", "episode_columns"]

ENDLESS_ADVICE = (
    "Set max_frames_per_traj to truncate long episodes (for a vector env that a factory "
    "builds, give its sub-envs a time limit instead, e.g. gymnasium.wrappers.TimeLimit)."
)
"""What to do about an episode that never ends, for single and vector envs alike."""


class Episodes:
    """Each env's current episode (id, steps so far, return so far), kept across batches, and
    the episodes that ended in the batch being collected.

    An aligned loop (row ``t`` of the batch is step ``t`` of every env) calls :meth:`begin`,
    :meth:`end` at the rows where episodes end, then :meth:`finish` for the batch's
    ``episode_id`` and ``step`` columns. A loop whose envs run at their own pace updates
    :attr:`id`, :attr:`step` and :attr:`ret` itself and reports ended episodes with
    :meth:`ended`.
    """

    def __init__(self, n_envs: int) -> None:
        self.n_envs = n_envs
        self.id = np.zeros(n_envs, np.int64)
        """Each env's episode id."""
        self.step = np.zeros(n_envs, np.int64)
        """Each env's steps in its episode so far."""
        self.ret = np.zeros(n_envs, np.float64)
        """Each env's return so far (float64 sums of the env's own rewards)."""
        self.returns: list[float] = []
        """Returns of the episodes that ended in the batch, in the order they ended."""
        self.lengths: list[int] = []
        """Lengths of the episodes that ended in the batch, in the same order."""
        self._carried = (self.id, self.step)
        self._start_row: list[int] = []
        self._ids: list[int] = []
        self._starts: list[tuple[int, int]] = []
        self._id_base = 0

    def restart(self, batch_id: int) -> None:
        """Every env starts a new episode at row 0 of batch ``batch_id``."""
        self.id[:] = episode_id_base(batch_id) + np.arange(self.n_envs)
        self.step[:] = 0
        self.ret[:] = 0.0

    def begin(self, batch_id: int) -> None:
        """Start the bookkeeping of batch ``batch_id``."""
        self.returns, self.lengths = [], []
        self._carried = (self.id.copy(), self.step.copy())
        # Each env's episode: the row it started at (negative: before this batch), its id.
        self._start_row = (-self.step).tolist()
        self._ids = self.id.tolist()
        self._starts = []  # (row, env) of each episode started in the batch
        self._id_base = episode_id_base(batch_id)

    def end(self, t: int, envs: list[int]) -> None:
        """The episodes of ``envs`` ended at row ``t``; their next ones start at row ``t + 1``."""
        ret, start_row, E = self.ret, self._start_row, self.n_envs
        for i in envs:
            self.returns.append(float(ret[i]))
            self.lengths.append(t + 1 - start_row[i])
            ret[i] = 0.0
            start_row[i] = t + 1
            self._ids[i] = self._id_base + (t + 1) * E + i
            self._starts.append((t + 1, i))

    def ended(self, ret: float, length: int) -> None:
        """Report an episode that ended in the batch (for loops that keep :attr:`id`,
        :attr:`step` and :attr:`ret` themselves)."""
        self.returns.append(ret)
        self.lengths.append(length)

    def finish(self, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """The batch's ``episode_id`` and ``step`` columns ``[steps, E]``; the envs' episodes
        carry on into the next batch."""
        ids, step = episode_columns(steps, self.n_envs, self._id_base, *self._carried,
                                    self._starts)
        self.id[:] = self._ids
        self.step[:] = steps - np.asarray(self._start_row)
        return ids, step

    def check_endless(self, env_name: str, limit: int) -> None:
        """Raise :class:`EnvError` for an env whose episode has run ``limit`` steps or more."""
        if self.step.max() >= limit:
            i = int(self.step.argmax())
            raise EnvError(
                f"env {env_name} (env index {i}) has run an episode of {int(self.step[i])} "
                f"steps without terminating or truncating. {ENDLESS_ADVICE}"
            )


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
