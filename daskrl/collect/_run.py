"""One started collection: its plan, supervision, weights and hand-over, as coroutines.

:class:`Run` is what a :class:`~daskrl.Collector` drives once started: it turns planned
batches into tasks (with the newest weights), yields finished batches in the order the
``sync`` option asks for (rounds on one weights version, or first finished first out with
``batches_in_flight`` per stream), and applies the hand-over rule. Every method that talks to
the cluster is a coroutine on the client's event loop.
"""

from __future__ import annotations

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
from daskrl.worker._tasks import BatchTask

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
        self._done: dict[int, tuple[Future, BatchHandle]] = {}
        self._ac: as_completed | None = None
        self._refill: list[int] | None = None  # sync=False: streams to submit a batch for

    @property
    def num_streams(self) -> int:
        return self.planner.num_streams

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

    def submit_now(self, plan: PlannedBatch, supervised: bool) -> Future:
        """Submit ``plan`` with the newest weights."""
        version = self.weights.version
        task = BatchTask(batch_id=plan.batch_id, stream=plan.stream,
                         previous_batch_id=plan.previous_batch_id, steps=plan.steps,
                         random_steps=plan.random_steps, weights_version=version,
                         weights=self.weights.ref(version), env=plan.env)
        return self.supervisor.dispatch(task, supervised=supervised)

    async def submit(self, plan: PlannedBatch, supervised: bool = True) -> Future:
        """:meth:`submit_now`, first scattering the weights again if they were lost."""
        await self.weights.republish_lost(self.workers)
        return self.submit_now(plan, supervised)

    async def next_handle(self) -> BatchHandle | None:
        """The next batch for an iterating learner, handed over; None when all are."""
        while True:
            if self.config.sync:
                fut, result = await self._next_in_round() or (None, None)
            else:
                fut, result = await self._next_first_done() or (None, None)
            if fut is None or result is None:
                return None
            self.supervisor.pending.pop(fut)
            del fut  # hold no future of a batch handed over: Dask would recompute it if lost
            handle = self.handover.take(result, self.weights.version)
            if handle is not None:
                return handle
            self.planner.requeue(result.frames)  # too stale: collected again

    async def _next_in_round(self) -> tuple[Future, BatchHandle] | None:
        """``sync=True``: fetched as tasks finish, handed over in batch order."""
        if not self._order:
            plans = self.planner.round()
            if not plans:
                return None
            self._ac = self.supervisor.new_as_completed(
                [await self.submit(p) for p in plans])
            self._order = [p.batch_id for p in plans]
        assert self._ac is not None
        batch_id = self._order.pop(0)
        while batch_id not in self._done:
            fut, result = await self.supervisor.next_done(self._ac)
            self._done[self.supervisor.pending[fut].batch_id] = (fut, result)
        return self._done.pop(batch_id)

    async def _next_first_done(self) -> tuple[Future, BatchHandle] | None:
        """``sync=False``: a stream's next batch is submitted when the learner comes back for
        a handle, so it gets the weights published meanwhile; its other batches in flight
        keep its worker busy in the meantime."""
        if self._ac is None:
            self._ac = self.supervisor.new_as_completed([])
            self._refill = self.planner.initial_streams()
        for stream in self._refill or ():
            plan = self.planner.next(stream)
            if plan is not None:
                self._ac.add(await self.submit(plan))
        self._refill = []
        if self._ac.is_empty():
            return None
        fut, result = await self.supervisor.next_done(self._ac)
        self._refill = [self.supervisor.pending[fut].stream]
        return fut, result
