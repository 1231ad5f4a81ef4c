"""The batch plan: which frames each batch collects, on which stream, under which id.

Pure bookkeeping, no Dask: :class:`Planner` hands out :class:`PlannedBatch` records in order
(the frame budget of ``total_frames``, one id per batch from the run's id range, each stream's
previous batch so its envs continue from there) and takes back the frames of batches that must
be collected again (dropped as too stale). The run gives each plan to its stream.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterator

from daskrl.config import CollectorConfig
from daskrl.errors import ConfigError
from daskrl.store._layout import batch_id_in_run

__all__ = ["Placement", "PlannedBatch", "Planner", "RoundsAhead", "stream_placement"]


@dataclasses.dataclass(frozen=True)
class PlannedBatch:
    """One batch to collect (the collector adds the weights it runs with)."""

    batch_id: int
    stream: int
    previous_batch_id: int | None
    """The stream's batch before this one: its envs continue from there."""
    frames: int
    steps: int
    random_steps: int
    env: int = 0
    """The env index the stream collects (``stream % num_envs``)."""


class Planner:
    """Frame budget, streams and batch ids of one run.

    ``first_id`` is the run's first batch id (ids are unique across a store's runs);
    ``num_streams`` the number of env streams collected in parallel; ``done_frames`` the frames
    of ``total_frames`` a resumed run finds committed already (they are not planned again, and
    ``init_random_frames`` counts them); ``num_envs`` the envs of the collection (stream ``s``
    collects env ``s % num_envs``).
    """

    def __init__(self, config: CollectorConfig, first_id: int, num_streams: int,
                 done_frames: int = 0, num_envs: int = 1) -> None:
        if num_streams < 1:
            raise ConfigError(f"num_streams must be >= 1, got {num_streams}.")
        if num_envs < 1 or num_streams % num_envs:
            raise ConfigError(f"num_streams={num_streams} must be a multiple of "
                              f"num_envs={num_envs} (>= 1): each env gets as many streams.")
        self.num_envs = num_envs
        self.config = config
        self.first_id = first_id
        self.num_streams = num_streams
        self._schedule: Iterator[int] = config.batch_frames(done_frames)
        self._exhausted = False
        self._requeue: collections.deque[int] = collections.deque()
        self._next_index = 0
        self._next_stream = 0
        self._stream_last: dict[int, int] = {}
        self.frames_planned = done_frames

    def requeue(self, frames: int) -> None:
        """Collect ``frames`` again (a batch of them was dropped); they come first."""
        self._requeue.append(frames)

    @property
    def exhausted(self) -> bool:
        """Whether every frame of the budget is planned (and nothing is requeued)."""
        if self._requeue:
            return False
        return self._exhausted

    def next(self, stream: int | None = None) -> PlannedBatch | None:
        """Plan the next batch, on ``stream`` (default: the streams in turn); None when the
        frame budget is spent."""
        if self._requeue:
            frames = self._requeue.popleft()
        else:
            if self._exhausted:
                return None
            got = next(self._schedule, None)
            if got is None:
                self._exhausted = True
                return None
            frames = got
        if stream is None:
            stream = self._next_stream
            self._next_stream = (self._next_stream + 1) % self.num_streams
        steps = frames // self.config.envs_per_worker
        batch_id = batch_id_in_run(self.first_id, self._next_index)
        plan = PlannedBatch(
            batch_id=batch_id,
            stream=stream,
            previous_batch_id=self._stream_last.get(stream),
            frames=frames,
            steps=steps,
            random_steps=self.config.random_steps(self.frames_planned, steps),
            env=stream % self.num_envs,
        )
        self._next_index += 1
        self._stream_last[stream] = batch_id
        self.frames_planned += frames
        return plan

    def round(self) -> list[PlannedBatch]:
        """``rounds=True``: one batch per stream, in batch-id order (fewer at the end of the
        budget)."""
        plans = (self.next(s) for s in range(self.num_streams))
        return [p for p in plans if p is not None]

    def initial_streams(self) -> list[int]:
        """``rounds=False``: the streams of the first batches, ``batches_in_flight`` each."""
        return [s for _ in range(self.config.batches_in_flight) for s in range(self.num_streams)]


def stream_placement(streams: list[str], stream: int, live: set[str]) -> str:
    """The worker for ``stream``'s next batch given the current placement ``streams`` (one
    worker per stream, updated in place) and the ``live`` workers.

    A stream stays on its worker (its envs live there) unless that worker left, or has two
    streams more than another (a replacement joined): it then moves to the live worker with
    the fewest streams, and its envs start afresh there at a batch boundary.
    """
    return Placement(streams, live).worker(stream)


class Placement:
    """:func:`stream_placement` for many streams in a row: the streams per worker are
    counted once and kept as streams move, so that checking every stream costs
    O(streams + workers), not O(streams x workers) (1,000 streams: 0.3 of the learner's
    core at 4 checks a second)."""

    def __init__(self, streams: list[str], live: set[str]) -> None:
        self.streams = streams
        """One worker per stream, updated in place."""
        self.load = dict.fromkeys(live, 0)
        for w in streams:
            if w in self.load:
                self.load[w] += 1
        self._least: str | None = None  # the live worker with the fewest streams, by name

    def worker(self, stream: int) -> str:
        """The worker for ``stream``'s next batch (see :func:`stream_placement`)."""
        current = self.streams[stream]
        if not self.load:
            return current
        if self._least is None:
            self._least = min(self.load, key=lambda w: (self.load[w], w))
        idle = self._least
        if current in self.load:
            # Counting the other streams only lowers current's load by one: it moves if that
            # is still above the least (then the least worker is the same).
            if self.load[current] - 1 <= self.load[idle]:
                return current
            self.load[current] -= 1
        self.streams[stream] = idle
        self.load[idle] += 1
        self._least = None
        return idle


class RoundsAhead:
    """Sync mode's rule for giving the round after the current one ahead, with it, on the same
    weights (it is taken back if the learner publishes meanwhile).

    The expectation: before the learner's first publish, a round ahead once it let a round end
    without publishing; after it, while this version has run fewer rounds than the version
    before it did (the learner's period). A learner that publishes after every round never
    gets a round ahead; one that publishes every ``p`` rounds loses one round in all, at its
    first publish.
    """

    def __init__(self) -> None:
        self.version: int | None = None
        """The weights version of the last round started."""
        self.run_length = 0
        """Rounds started on :attr:`version`."""
        self.period: int | None = None
        """Rounds the version before it ran (None: the learner has not published yet)."""

    def start_round(self, version: int, version_at_last_round_end: int | None) -> bool:
        """A round starts on weights ``version``; whether to give the next one ahead.
        ``version_at_last_round_end``: the newest version as the last round's last batch was
        taken (None: none ended yet)."""
        if version == self.version:
            self.run_length += 1
        else:
            if self.version is not None:
                self.period = self.run_length
            self.version, self.run_length = version, 1
        if self.period is None:
            return version_at_last_round_end == version
        return self.run_length < self.period
