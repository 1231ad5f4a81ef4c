"""One started collection: its plan, supervision, weights and hand-over, as coroutines.

:class:`Run` is what a :class:`~daskrl.Collector` drives once started: it turns planned
batches into tasks (with the newest weights), yields finished batches in the order the
``sync`` option asks for (rounds on one weights version, or first finished first out with
``batches_in_flight`` per stream), and applies the hand-over rule. Every method that talks to
the cluster is a coroutine on the client's event loop.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

from distributed import Client, Future, as_completed

from daskrl.collect._env_list import stream_count
from daskrl.collect._handover import HandOver
from daskrl.collect._planner import PlannedBatch, Planner
from daskrl.collect._resume import Resume
from daskrl.collect._supervisor import Supervisor, Workers
from daskrl.config import CollectorConfig
from daskrl.errors import UsageError
from daskrl.store._handles import BatchHandle
from daskrl.store._store import TrajectoryStore
from daskrl.weights._publish import WeightsPublisher
from daskrl.weights._snapshot import WeightsSnapshot
from daskrl.worker._tasks import BatchGroup, BatchTask

__all__ = ["Run"]


class Run:
    """The state of a started collection (see the module docstring)."""

    def __init__(self, client: Client, config: CollectorConfig, plugin_name: str,
                 key_prefix: str, first_id: int, workers: Workers,
                 weights: WeightsPublisher, store: TrajectoryStore | None = None,
                 resume: Resume | None = None, num_envs: int = 1) -> None:
        num_streams = stream_count(config.num_workers, len(workers.live), num_envs)
        live = sorted(workers.live)
        self.config = config
        self.workers = workers
        self.weights = weights
        self.resume = resume
        """What this run resumes (its committed frames are not planned again), or None."""
        self.planner = Planner(config, first_id, num_streams,
                               resume.frames if resume is not None else 0, num_envs=num_envs)
        self.handover = HandOver(config.max_policy_lag, store)
        self.supervisor = Supervisor(
            client, plugin_name, key_prefix, workers, weights,
            [live[s % len(live)] for s in range(num_streams)], config.lost_workers_timeout)
        self._order: list[int] = []  # sync rounds: batch ids of the round left to hand over
        self._done: dict[int, BatchHandle] = {}  # sync rounds: fetched, not yet handed over
        self._ready: collections.deque[BatchHandle] = collections.deque()  # likewise, async
        self._ac: as_completed | None = None
        self._refill: list[int] | None = None  # sync=False: streams to submit a task for
        # sync rounds ahead (see _start_round): the round after the current one, submitted
        # with it, and the rounds of versions the learner has let run
        self._ahead: list[PlannedBatch] = []
        self._ahead_version: int | None = None
        self._stale: set[int] = set()  # batch ids of rounds taken back, not yet fetched
        self._round_end_version: int | None = None  # the version as the last round ended
        self._round_version: int | None = None  # the version of the last round started
        self._run_length = 0  # rounds started on _round_version
        self._period: int | None = None  # rounds the version before it ran (None: no publish)
        self.rounds_ahead_dropped = 0
        """Rounds submitted ahead and taken back because the learner published meanwhile."""

    @property
    def num_streams(self) -> int:
        return self.planner.num_streams

    @property
    def in_flight(self) -> int:
        """Batches submitted and not yet handed over (queued, running, or fetched), less a
        sync round submitted ahead or taken back: 0 right after a round's last handle."""
        skip = {p.batch_id for p in self._ahead} | self._stale
        ids = [i for task in self.supervisor.pending.values() for i in task.batch_ids]
        return (sum(i not in skip for i in ids) + sum(i not in skip for i in self._done)
                + len(self._ready))

    def in_use(self) -> Iterable[int]:
        """Weights versions batches in flight still need."""
        return {t.weights_version for t in self.supervisor.pending.values()}

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
        return await self.weights.publish(snap, self.workers, self.in_use(), wait)

    def submit_now(self, plans: PlannedBatch | list[PlannedBatch], supervised: bool) -> Future:
        """Submit ``plans`` (one batch, or a list: one task of consecutive batches of one
        stream, whose future holds their handles) with the newest weights."""
        version = self.weights.version
        ref = self.weights.ref(version)
        tasks = [BatchTask(batch_id=p.batch_id, stream=p.stream,
                           previous_batch_id=p.previous_batch_id, steps=p.steps,
                           random_steps=p.random_steps, weights_version=version,
                           weights=ref, env=p.env)
                 for p in (plans if isinstance(plans, list) else [plans])]
        if isinstance(plans, list):
            return self.supervisor.dispatch(BatchGroup(tuple(tasks)), supervised=supervised)
        return self.supervisor.dispatch(tasks[0], supervised=supervised)

    async def submit(self, plans: PlannedBatch | list[PlannedBatch],
                     supervised: bool = True) -> Future:
        """:meth:`submit_now`, first scattering the weights again if they were lost."""
        await self.weights.republish_lost(self.workers)
        return self.submit_now(plans, supervised)

    def _task(self, plans: list[PlannedBatch]) -> PlannedBatch | list[PlannedBatch]:
        """What one task collects: a single batch as today, or a group (batches_per_task>1)."""
        return plans if self.config.batches_per_task > 1 else plans[0]

    async def _fetch(self, ac: as_completed) -> BatchTask | BatchGroup:
        """Wait for the next finished task; keep its handles (the future is let go)."""
        fut, result = await self.supervisor.next_done(ac)
        task = self.supervisor.pending.pop(fut)
        del fut  # hold no future of a fetched batch: Dask would recompute it if lost
        handles = result if isinstance(result, list) else [result]
        if self.config.sync:
            for h in handles:
                if h is not None and h.batch_id in self._stale:  # of a round taken back
                    self._stale.discard(h.batch_id)
                    self.handover.stats.drop(h)
                elif h is not None:
                    self._done[h.batch_id] = h
        else:
            self._ready.extend(h for h in handles if h is not None)
        return task

    async def next_handle(self) -> BatchHandle | None:
        """The next batch for an iterating learner, handed over; None when all are."""
        while True:
            if self.config.sync:
                handle = await self._next_in_round()
            else:
                handle = await self._next_first_done()
            if handle is None:
                return None
            taken = self._take(handle)
            if taken is not None:
                return taken

    def next_fetched(self) -> BatchHandle | None:
        """The next batch, handed over, if it is fetched already and nothing is to be submitted
        before it; else None (ask :meth:`next_handle`). Not a coroutine: a learner's thread
        calls it between its calls of :meth:`next_handle`, so that the handles of a task of
        many batches cost no round trip to the event loop each (~0.2 ms of CPU)."""
        while True:
            if self.config.sync:
                if not self._order or self._order[0] not in self._done:
                    return None
                handle = self._done.pop(self._order.pop(0))
            else:
                if self._refill or not self._ready:
                    return None
                handle = self._ready.popleft()
            taken = self._take(handle)
            if taken is not None:
                return taken

    def _take(self, handle: BatchHandle) -> BatchHandle | None:
        """The hand-over rule for a fetched batch; None if it was dropped as too stale."""
        taken = self.handover.take(handle, self.weights.version)
        if self.config.sync and not self._order:  # the round's last batch
            self._round_end_version = self.weights.version if taken is not None else None
        if taken is None:
            self.planner.requeue(handle.frames)  # too stale: collected again
        return taken

    async def _next_in_round(self) -> BatchHandle | None:
        """``sync=True``: fetched as tasks finish, handed over in batch order."""
        if not self._order and not await self._start_round():
            return None
        assert self._ac is not None
        batch_id = self._order.pop(0)
        while batch_id not in self._done:
            await self._fetch(self._ac)
        return self._done.pop(batch_id)

    async def _start_round(self) -> bool:
        """Submit the next round with the newest weights; False when the budget is spent.

        A round runs on the weights version that is newest when the learner asks for its first
        batch. Where the learner is not expected to publish after this round, the round after
        it is submitted now too, on the same weights, so that each worker starts it as soon as
        it finishes this one (no round trip to the learner between rounds). When the learner
        asks for that round and the version is still the same, it is used as is; otherwise it
        is taken back: its batches are dropped like batches over ``max_policy_lag``
        (committed, not handed over, counted in ``dropped_stale``, their frames collected again
        with the new weights; the streams' episodes continue through them).

        The expectation: before the learner's first publish, a round ahead once it let a round
        end without publishing; after it, while this version has run fewer rounds than the
        version before it did (the learner's period). A learner that publishes after every
        round never gets a round ahead; one that publishes every ``p`` rounds loses one round
        in all, at its first publish.
        """
        version = self.weights.version
        if version == self._round_version:
            self._run_length += 1
        else:
            if self._round_version is not None:
                self._period = self._run_length
            self._round_version, self._run_length = version, 1
        if self._period is None:
            ahead = self._round_end_version == version
        else:
            ahead = self._run_length < self._period
        plans, self._ahead = self._ahead, []
        if plans and self._ahead_version != version:
            self._take_back(plans)
            plans = []
        if not plans:
            plans = await self._submit_round()
            if not plans:
                return False
        self._order = [p.batch_id for p in plans]
        if ahead:
            self._ahead, self._ahead_version = await self._submit_round(), version
        return True

    async def _submit_round(self) -> list[PlannedBatch]:
        """Plan and submit a round, one task per stream (none at the end of the budget)."""
        plans = self.planner.round()
        by_stream: dict[int, list[PlannedBatch]] = {}
        for p in plans:
            by_stream.setdefault(p.stream, []).append(p)
        futures = [await self.submit(self._task(ps)) for ps in by_stream.values()]
        if self._ac is None:
            self._ac = self.supervisor.new_as_completed(futures)
        else:
            self._ac.update(futures)
        return plans

    def _take_back(self, plans: list[PlannedBatch]) -> None:
        """Drop a round submitted ahead as stale and plan its frames again."""
        for plan in plans:
            self.planner.requeue(plan.frames)
            handle = self._done.pop(plan.batch_id, None)
            if handle is not None:
                self.handover.stats.drop(handle)
            else:
                self._stale.add(plan.batch_id)
        self.rounds_ahead_dropped += 1

    async def _next_first_done(self) -> BatchHandle | None:
        """``sync=False``: a stream's next task is submitted when the learner comes back for
        a handle after its last task finished, so it gets the weights published meanwhile; its
        other tasks in flight keep its worker busy in the meantime."""
        if self._ac is None:
            self._ac = self.supervisor.new_as_completed([])
            self._refill = self.planner.initial_streams()
        while True:
            for stream in self._refill or ():
                plans = self.planner.task(stream)
                if plans:
                    self._ac.add(await self.submit(self._task(plans)))
            self._refill = []
            if not self._ready:
                if self._ac.is_empty():
                    return None
                self._refill = [(await self._fetch(self._ac)).stream]
            if self._ready:
                return self._ready.popleft()
