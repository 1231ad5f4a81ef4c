"""Fault supervision on the learner's side: live workers, deadlines, stranded batches.

:class:`Workers` knows which workers the collector uses (those the scheduler lists, less those
cut off: silent for ``call_timeout`` or a call to them timed out) and bounds every call to the
cluster by ``call_timeout``; the run (:mod:`daskrl.collect._run`) asks it every
``HEALTH_CHECK_S`` while the learner waits, and starts the streams of departed workers again.
:class:`Supervisor` owns ``submit()``'s batches, one Dask task each.

Everything here is a coroutine on the client's event loop: the collector runs it with the
client's own sync machinery for synchronous clients, so both kinds get the same supervision.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from distributed import Client, Future, as_completed

from daskrl.collect._planner import stream_placement
from daskrl.errors import ClusterError, ClusterTimeoutError
from daskrl.weights._publish import WeightsPublisher
from daskrl.worker._tasks import BatchTask, collect_batch

__all__ = ["HEALTH_CHECK_S", "Supervisor", "Workers", "scheduler"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

HEALTH_CHECK_S = 0.25
"""How often the learner checks the cluster's membership while it waits for a batch."""

_FULL_CHECK_MAX_S = 2.0
"""The longest gap between two full checks (every worker's heartbeat) while it waits."""


def scheduler(client: Client) -> Any:
    """The client's connection to the scheduler (its RPC methods are coroutines)."""
    if client.scheduler is None:
        raise ClusterError("the client is not connected to a scheduler; start it first.")
    return client.scheduler


class Workers:
    """The workers a collector uses, and the deadline of every call to the cluster."""

    def __init__(self, client: Client, call_timeout: float, workers: list[str]) -> None:
        self.client = client
        self.call_timeout = call_timeout
        self.live: set[str] = set(workers)
        self._checked = time.monotonic()
        self._members: set[str] = set(workers)  # the scheduler's workers at the last refresh
        self.full_check_s = max(HEALTH_CHECK_S, min(_FULL_CHECK_MAX_S, call_timeout / 8))
        """How often :meth:`check` asks for every worker's heartbeat (finding workers cut off
        within ``call_timeout`` plus this)."""
        # Workers cut off from the cluster: worker -> its last heartbeat when dropped (heard
        # from again, it is used again; gone from the scheduler, it is forgotten).
        self.unresponsive: dict[str, Any] = {}
        self._heard: dict[str, tuple[Any, float]] = {}  # worker -> (last_seen, when it moved)

    def timeout_error(self, what: str) -> ClusterTimeoutError:
        return ClusterTimeoutError(
            f"{what} did not complete within call_timeout={self.call_timeout:g}s: the "
            "scheduler or a worker does not answer. Check the network between the learner, "
            "the scheduler and the workers, or raise call_timeout."
        )

    async def bounded(self, what: str, awaitable: Awaitable[T]) -> T:
        """``await awaitable`` within ``call_timeout``; past it :class:`ClusterTimeoutError`."""
        try:
            return await asyncio.wait_for(awaitable, self.call_timeout)
        except (TimeoutError, asyncio.TimeoutError) as e:
            raise self.timeout_error(what) from e

    async def refresh(self, force: bool = False) -> set[str]:
        """The live workers, asking the scheduler if ``force`` or the last answer is over 1 s
        old; a worker silent for ``call_timeout`` is dropped."""
        now = time.monotonic()
        if not force and now - self._checked <= 1.0:
            return self.live
        info = await self.bounded("asking the scheduler for its workers",
                                  scheduler(self.client).identity(n_workers=-1))
        workers = info.get("workers", {})
        for w, ws in workers.items():
            seen = ws.get("last_seen")
            if self._heard.get(w, (None,))[0] != seen:
                self._heard[w] = (seen, now)
        for w in set(self._heard) - set(workers):
            del self._heard[w]
        for w in list(self.unresponsive):
            if w not in workers or workers[w].get("last_seen") != self.unresponsive[w]:
                del self.unresponsive[w]
        for w in workers:
            if self.silent(w) and w not in self.unresponsive:
                self.drop(w, f"no heartbeat for over {self.call_timeout:g}s")
        self.live = set(workers) - set(self.unresponsive)
        self._members = set(workers)
        self._checked = now
        return self.live

    async def check(self) -> set[str]:
        """The frequent health check: the live workers, asking the scheduler only for its
        worker list (``ncores``: address -> threads, a small answer), and doing the full
        :meth:`refresh` (every worker's identity, to find the silent ones) when that list
        changed or the last full one is ``full_check_s`` old."""
        if time.monotonic() - self._checked >= self.full_check_s:
            return await self.refresh(force=True)
        members = await self.bounded("asking the scheduler for its workers",
                                     scheduler(self.client).ncores())
        if set(members) != self._members:
            return await self.refresh(force=True)
        return self.live

    def silent(self, worker: str) -> bool:
        """Whether the scheduler has had no heartbeat from ``worker`` for ``call_timeout``."""
        heard = self._heard.get(worker)
        return heard is not None and time.monotonic() - heard[1] > self.call_timeout

    def drop(self, worker: str, why: str) -> None:
        """Stop using ``worker`` (cut off): its streams and waiting batches move elsewhere."""
        if worker not in self.unresponsive:
            logger.warning("worker %s is not responding (%s); collecting without it",
                           worker, why)
            self.unresponsive[worker] = self._heard.get(worker, (None,))[0]
        self.live.discard(worker)

    async def wait_each(self, futures: dict[str, Future], what: str) -> dict[str, Future]:
        """Wait up to ``call_timeout`` for one task per worker; raise the first task error.

        Return the finished ones. A worker whose task did not finish is dropped if it is also
        silent (cut off); a busy worker is only logged. None finished: ClusterTimeoutError.
        """
        ac = as_completed(list(futures.values()), loop=self.client.loop,
                          timeout=self.call_timeout)
        try:
            async for _ in ac:
                pass
        except (TimeoutError, asyncio.TimeoutError):
            pass
        done: dict[str, Future] = {}
        late = []
        for w, fut in futures.items():
            if fut.status == "error":
                await fut  # raises the worker's error, with its traceback
            if fut.status == "finished":
                done[w] = fut
            else:
                late.append(fut)
                await self.refresh(force=True)
                if self.silent(w) or w not in self.live:
                    self.drop(w, f"{what} took over {self.call_timeout:g}s")
                else:
                    logger.warning("worker %s did not finish %s within %gs (busy); going on "
                                   "without it", w, what, self.call_timeout)
        if late:
            await self.client.cancel(late)
        if futures and not done:
            raise ClusterTimeoutError(
                f"no worker finished {what} within call_timeout={self.call_timeout:g}s "
                f"(workers: {sorted(futures)}). Check that the workers can reach the "
                "scheduler and each other, or raise call_timeout."
            )
        return done


class Supervisor:
    """``submit()``'s batches: one Dask task each, on its stream's worker (loosely: Dask may
    run it elsewhere), held until handed over. (An iterated collection's batches go through
    its streams: :mod:`daskrl.collect._streams`.)"""

    def __init__(self, client: Client, plugin_name: str, key_prefix: str, workers: Workers,
                 weights: WeightsPublisher, stream_workers: list[str]) -> None:
        self.client = client
        self.plugin_name = plugin_name
        self.key_prefix = key_prefix
        self.workers = workers
        self.weights = weights
        self.stream_workers = stream_workers
        self.pending: dict[Future, BatchTask] = {}
        """Submitted, not yet handed over."""

    def dispatch(self, task: BatchTask, supervised: bool = False) -> Future:
        """Submit ``task`` to its stream's worker; the caller owns the future."""
        worker = stream_placement(self.stream_workers, task.stream, self.workers.live)
        fut = self.client.submit(
            collect_batch, self.plugin_name, task,
            key=f"daskrl-collect-{self.key_prefix}-{task.batch_id}",
            workers=[worker], allow_other_workers=True, pure=False,
        )
        self.pending[fut] = task
        return fut

    async def cancel_all(self) -> None:
        """Cancel every batch in flight."""
        pending = list(self.pending)
        self.pending.clear()
        if pending:
            await self.client.cancel(pending)
