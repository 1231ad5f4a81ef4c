"""One started collection: its plan, streams, supervision, weights and hand-over.

:class:`Run` is what a :class:`~daskrl.Collector` drives once started: it gives planned
batches to the streams (:class:`~daskrl.collect._streams.StreamSet`, one long-lived task per
stream that sends each handle straight back), applies the hand-over rule, and keeps the
collection healthy while the learner waits. ``submit()``'s batches are Dask tasks of their
own, one per batch. The order handles leave in is its two subclasses', one per ``rounds``
setting: :class:`Rounds` (rounds on one weights version, in batch order) and
:class:`FirstDone` (first finished, first out, with ``batches_in_flight`` credits per stream);
:func:`new_run` picks one. Every method that talks to the cluster is a coroutine on the
client's event loop.
"""

from __future__ import annotations

import abc
import collections
import time
from collections.abc import Iterable
from typing import Any

from distributed import Client, Future

from daskrl.collect._env_list import stream_count
from daskrl.collect._handover import HandOver
from daskrl.collect._planner import PlannedBatch, Planner, RoundsAhead
from daskrl.collect._resume import Resume
from daskrl.collect._streams import Inbox, StreamSet
from daskrl.collect._supervisor import HEALTH_CHECK_S, Supervisor, Workers
from daskrl.config import CollectorConfig
from daskrl.errors import (
    ClusterError,
    CollectorClosedError,
    UsageError,
    WeightsNotSharedError,
)
from daskrl.store._handles import BatchHandle
from daskrl.store._store import TrajectoryStore
from daskrl.weights._publish import WeightsPublisher
from daskrl.weights._snapshot import WeightsSnapshot
from daskrl.worker._tasks import BatchTask, with_weights

__all__ = ["FirstDone", "Rounds", "Run", "new_run"]

MAX_WEIGHTS_RETRIES = 3
"""Times a batch is sent again after its worker could not read the learner's shared memory."""


def new_run(client: Client, config: CollectorConfig, plugin_name: str, key_prefix: str,
            first_id: int, workers: Workers, weights: WeightsPublisher,
            store: TrajectoryStore | None = None, resume: Resume | None = None,
            num_envs: int = 1) -> Run:
    """The :class:`Run` of ``config.rounds``: :class:`Rounds` or :class:`FirstDone`."""
    kind: type[Run] = Rounds if config.rounds else FirstDone
    return kind(client, config, plugin_name, key_prefix, first_id, workers, weights, store,
                resume, num_envs)


class Run(abc.ABC):
    """The state of a started collection that both hand-over orders share (see the module
    docstring)."""

    def __init__(self, client: Client, config: CollectorConfig, plugin_name: str,
                 key_prefix: str, first_id: int, workers: Workers,
                 weights: WeightsPublisher, store: TrajectoryStore | None = None,
                 resume: Resume | None = None, num_envs: int = 1) -> None:
        num_streams = stream_count(config.num_workers, len(workers.live), num_envs)
        live = sorted(workers.live)
        placement = [live[s % len(live)] for s in range(num_streams)]
        self.config = config
        self.workers = workers
        self.weights = weights
        self.resume = resume
        """What this run resumes (its committed frames are not planned again), or None."""
        self.planner = Planner(config, first_id, num_streams,
                               resume.frames if resume is not None else 0, num_envs=num_envs)
        self.handover = HandOver(config.max_policy_lag, store)
        self.supervisor = Supervisor(client, plugin_name, key_prefix, workers, weights,
                                     list(placement))
        self.inbox = Inbox()
        self.streams = StreamSet(client, plugin_name, key_prefix, workers, placement,
                                 self.inbox)
        self._given: dict[int, BatchTask] = {}  # given to the streams, not handed over
        self._retries: collections.Counter[int] = collections.Counter()
        self._checked = 0.0
        self._no_workers_since: float | None = None

    @property
    def num_streams(self) -> int:
        return self.planner.num_streams

    async def start(self) -> None:
        """Start the streams (after version 0 is published): each connects to the learner;
        a stream that cannot fails the start with its error."""
        await self.streams.start()
        if self.weights.version >= 0:
            self.streams.announce(self.weights.version, self.weights.ref(self.weights.version))
        # a stream tries to connect for call_timeout: its error (or its connection) comes
        # within that and the task's start
        await self.streams.wait_connected(2 * self.config.call_timeout)

    @property
    def in_flight(self) -> int:
        """Batches given or submitted and not yet handed over (queued, running, or
        arrived)."""
        return len(self._given) + len(self.supervisor.pending)

    def in_use(self) -> Iterable[int]:
        """Weights versions batches in flight still need."""
        return ({t.weights_version for t in self._given.values()}
                | {t.weights_version for t in self.supervisor.pending.values()})

    def hand_over(self, handle: BatchHandle, future: Future | None = None) -> BatchHandle:
        """Take over a ``submit()`` batch (its handle, and its future if known): its policy lag
        is set and it is counted (:meth:`~daskrl.Collector.hand_over`)."""
        pending = self.supervisor.pending
        if future is None and isinstance(handle, BatchHandle):
            future = next((f for f, t in pending.items() if t.batch_id == handle.batch_id), None)
        if not isinstance(handle, BatchHandle) or future not in pending:
            what = handle.batch_id if isinstance(handle, BatchHandle) else repr(handle)
            raise UsageError(
                f"hand_over got batch {what}, which is not a batch of this collector waiting to "
                "be handed over: pass each handle of a submit() future once; handles from "
                "iterating the collector are handed over already.")
        pending.pop(future)
        return self.handover.accept(handle, self.weights.version)

    async def publish(self, snap: WeightsSnapshot, wait: bool) -> int:
        """Publish ``snap`` and tell the streams of it (they use it from their next batch
        that may: ``rounds=False``, or the next round)."""
        version = await self.weights.publish(snap, self.workers, self.in_use(), wait)
        if self.streams.address:
            self.streams.announce(version, self.weights.ref(version))
        return version

    def _task(self, plan: PlannedBatch, newest_ok: bool = False) -> BatchTask:
        version = self.weights.version
        return BatchTask(batch_id=plan.batch_id, stream=plan.stream,
                         previous_batch_id=plan.previous_batch_id, steps=plan.steps,
                         random_steps=plan.random_steps, weights_version=version,
                         weights=self.weights.ref(version), env=plan.env, newest_ok=newest_ok)

    def _give(self, plan: PlannedBatch, newest_ok: bool = False) -> None:
        task = self._task(plan, newest_ok)
        self._given[task.batch_id] = task
        self.streams.give(task)

    async def submit(self) -> Future:
        """``submit()``: one Dask task for the next planned batch, with the newest weights,
        scattered again first if they were lost (the caller owns its future)."""
        plan = self.planner.next()
        if plan is None:
            raise CollectorClosedError(
                f"total_frames={self.config.total_frames} are all submitted; no batch is left.")
        await self.weights.republish_lost(self.workers)
        return self.supervisor.dispatch(self._task(plan), supervised=False)

    # -- what the streams send ---------------------------------------------------------------
    async def _pump(self) -> list[BatchHandle]:
        """Wait for what the streams send (up to the health check's period) and return the
        handles that arrived; keep the collection healthy meanwhile."""
        await self.inbox.wait(HEALTH_CHECK_S)
        if self.inbox.error is not None:
            raise self.inbox.error
        arrived = []
        while self.inbox.items:
            kind, value, task = self.inbox.items.popleft()
            if task.batch_id not in self._given:
                continue
            if kind == "handle":
                arrived.append(value)
            else:
                await self._failed(value, task)
        if time.monotonic() - self._checked >= HEALTH_CHECK_S:
            await self._supervise()
        return arrived

    async def _failed(self, error: BaseException, task: BatchTask) -> None:
        """A batch raised on its worker: raise it here, unless the worker only could not read
        the learner's shared memory (another machine): then it goes through Dask, again."""
        if isinstance(error, WeightsNotSharedError) and \
                self._retries[task.batch_id] < MAX_WEIGHTS_RETRIES:
            self._retries[task.batch_id] += 1
            await self.weights.stop_sharing(error, self.workers)
            again = with_weights(task, self.weights.ref(task.weights_version))
            self._given[task.batch_id] = again
            self.streams.give(again)
            return
        raise error

    async def _supervise(self) -> None:
        """Live workers, lost weights, streams to start again, and the deadline of a cluster
        without workers."""
        self._checked = time.monotonic()
        live = await self.workers.check()
        if live:
            self._no_workers_since = None
        elif self._no_workers_since is None:
            self._no_workers_since = time.monotonic()
        elif time.monotonic() - self._no_workers_since > self.config.lost_workers_timeout:
            raise ClusterError(
                f"the cluster has had no workers for {self.config.lost_workers_timeout:.0f}s "
                f"({len(self._given)} batches waiting). Start workers or check the "
                "cluster, then collect again (batches committed so far are in the store).")
        if live:
            await self.weights.republish_lost(self.workers)
            await self.streams.check(live)

    # -- handing over ------------------------------------------------------------------------
    @abc.abstractmethod
    async def next_handle(self) -> BatchHandle | None:
        """The next batch for an iterating learner, handed over; None when all are."""

    def _take(self, handle: BatchHandle) -> BatchHandle | None:
        """The hand-over rule for an arrived batch; None if it was dropped as too stale (its
        frames are collected again)."""
        self._given.pop(handle.batch_id, None)
        self._retries.pop(handle.batch_id, None)
        taken = self.handover.take(handle, self.weights.version)
        if taken is None:
            self.planner.requeue(handle.frames)
        return taken

    async def close(self) -> None:
        """Stop the streams and cancel ``submit()``'s batches: nothing is in flight after."""
        self._given.clear()
        await self.streams.close()
        await self.supervisor.cancel_all()


class Rounds(Run):
    """``rounds=True``: one batch per stream per round, all on one weights version, handed
    over in batch order as the round's batches arrive (and the round ahead: :meth:`_start_round`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._order: list[int] = []  # batch ids of the round left to hand over
        self._done: dict[int, BatchHandle] = {}  # arrived, not yet handed over
        self._ahead: list[PlannedBatch] = []  # the round after the current one, given with it
        self._ahead_version: int | None = None
        self._stale: set[int] = set()  # batch ids of rounds taken back, not yet arrived
        self._round_end_version: int | None = None  # the version as the last round ended
        self._rounds_ahead = RoundsAhead()
        self.rounds_ahead_dropped = 0
        """Rounds given ahead and taken back because the learner published meanwhile."""

    @property
    def in_flight(self) -> int:
        """:attr:`Run.in_flight`, less a round given ahead or taken back: 0 right after a
        round's last handle."""
        skip = {p.batch_id for p in self._ahead} | self._stale
        return super().in_flight - len(skip & self._given.keys())

    def _arrived(self, handles: list[BatchHandle]) -> None:
        for handle in handles:
            if handle.batch_id in self._stale:  # of a round taken back
                self._stale.discard(handle.batch_id)
                self._given.pop(handle.batch_id, None)
                self.handover.stats.drop(handle)
            else:
                self._done[handle.batch_id] = handle

    async def next_handle(self) -> BatchHandle | None:
        while True:
            if not self._order and not self._start_round():
                return None
            batch_id = self._order.pop(0)
            while batch_id not in self._done:
                self._arrived(await self._pump())
            taken = self._take(self._done.pop(batch_id))
            if not self._order:  # the round's last batch
                self._round_end_version = self.weights.version if taken is not None else None
            if taken is not None:
                return taken

    def _start_round(self) -> bool:
        """Give the streams the next round with the newest weights; False when the budget is
        spent.

        A round runs on the weights version that is newest when the learner asks for its first
        batch. Where the learner is not expected to publish after this round, the round after
        it is given now too, on the same weights, so that each stream starts it as soon as it
        finishes this one (no round trip to the learner between rounds). When the learner
        asks for that round and the version is still the same, it is used as is; otherwise it
        is taken back: its batches are dropped like batches over ``max_policy_lag``
        (committed, not handed over, counted in ``dropped_stale``, their frames collected again
        with the new weights; the streams' episodes continue through them).

        Whether to give the round after it is :class:`~daskrl.collect._planner.RoundsAhead`'s
        rule.
        """
        version = self.weights.version
        ahead = self._rounds_ahead.start_round(version, self._round_end_version)
        plans, self._ahead = self._ahead, []
        if plans and self._ahead_version != version:
            self._take_back(plans)
            plans = []
        if not plans:
            plans = self._give_round()
            if not plans:
                return False
        self._order = [p.batch_id for p in plans]
        if ahead:
            self._ahead, self._ahead_version = self._give_round(), version
        return True

    def _give_round(self) -> list[PlannedBatch]:
        """Plan a round and give it to the streams, one batch each (none at the end of the
        budget)."""
        plans = self.planner.round()
        for plan in plans:
            self._give(plan)
        return plans

    def _take_back(self, plans: list[PlannedBatch]) -> None:
        """Drop a round given ahead as stale and plan its frames again."""
        for plan in plans:
            self.planner.requeue(plan.frames)
            handle = self._done.pop(plan.batch_id, None)
            if handle is not None:
                self._given.pop(plan.batch_id, None)
                self.handover.stats.drop(handle)
            else:
                self._stale.add(plan.batch_id)
        self.rounds_ahead_dropped += 1

    async def close(self) -> None:
        self._done.clear()
        self._ahead, self._stale = [], set()
        await super().close()


class FirstDone(Run):
    """``rounds=False``: first finished, first out. Each stream starts with
    ``batches_in_flight`` batches; it gets its next one when the learner comes back for a
    handle after taking its last one (a credit back), with the newest weights; its other
    batch in flight keeps its worker busy in the meantime."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ready: collections.deque[BatchHandle] = collections.deque()  # arrived
        self._refill: list[int] | None = None  # streams to give a batch (None: not started)

    async def next_handle(self) -> BatchHandle | None:
        while True:
            handle = await self._next_done()
            if handle is None:
                return None
            taken = self._take(handle)
            if taken is not None:
                return taken

    async def _next_done(self) -> BatchHandle | None:
        """The first arrived batch not handed over, after giving the streams owed a credit
        their next batch; None when the budget is spent and nothing is in flight."""
        if self._refill is None:
            self._refill = self.planner.initial_streams()
        while True:
            for stream in self._refill:
                plan = self.planner.next(stream)
                if plan is not None:
                    self._give(plan, newest_ok=True)
            self._refill = []
            if self._ready:
                handle = self._ready.popleft()
                self._refill = [self._given[handle.batch_id].stream]
                return handle
            if not self._given:
                return None
            self._ready.extend(await self._pump())

    async def close(self) -> None:
        self._ready.clear()
        await super().close()
