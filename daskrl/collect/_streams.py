"""The learner's side of the streams: one long-lived task per stream, fed with batches.

:class:`StreamSet` starts one :func:`~daskrl.worker._stream.run_stream` task per stream, pinned
to the stream's worker, and talks to it over its channel (:class:`~daskrl.collect._channel.
Listener`): it sends the stream the batches the learner gives it (:meth:`StreamSet.give`, the
credits of the backpressure: nothing more runs ahead) and every new weights version
(:meth:`StreamSet.announce`), and puts what comes back in the :class:`Inbox`.

A stream whose channel closes, whose worker left or was cut off, or whose task ended, is
started again (a new *epoch*; an older epoch that reconnects is refused) on a live worker, and
is sent again every batch it had not answered, so that no batch is lost; a batch that the old
stream committed meanwhile is committed once (the store keeps the first commit), and its
handle comes back once. A stream moves to a joining worker at a batch boundary: it is sent no
new batch until it answered those it has, then it starts there. Everything here runs on the
client's event loop.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
import uuid
from typing import Any

from distributed import Client, Future
from distributed.comm import CommClosedError
from distributed.protocol import to_serialize

from daskrl.collect._channel import Listener
from daskrl.collect._planner import Placement, stream_placement
from daskrl.collect._supervisor import Workers
from daskrl.errors import StreamError
from daskrl.store._handles import BatchHandle
from daskrl.weights._cache import WeightsRef
from daskrl.worker._stream import StreamSpec, batch_message, run_stream
from daskrl.worker._tasks import BatchTask

__all__ = ["Inbox", "StreamSet"]

logger = logging.getLogger(__name__)

MAX_STARTS_WITHOUT_A_BATCH = 8
"""A stream started this many times in a row without answering a batch is a
:class:`~daskrl.errors.StreamError` (something on the workers keeps it from running)."""


class Inbox:
    """What the streams sent, for the learner: ``("handle", handle, task)`` and ``("error",
    exception, task)`` items, or the error that ends the collection."""

    def __init__(self) -> None:
        self.items: collections.deque[tuple[str, Any, BatchTask]] = collections.deque()
        self.error: BaseException | None = None
        self._event = asyncio.Event()

    def put(self, item: tuple[str, Any, BatchTask]) -> None:
        self.items.append(item)
        self._event.set()

    def fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self._event.set()

    async def wait(self, timeout: float) -> None:
        """Until an item or an error is in, or ``timeout`` seconds."""
        if self.items or self.error is not None:
            return
        self._event.clear()
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except (TimeoutError, asyncio.TimeoutError):
            pass


@dataclasses.dataclass(eq=False)
class _Stream:
    index: int
    worker: str
    epoch: int = 0
    future: Future | None = None
    comm: Any = None
    sent: dict[int, BatchTask] = dataclasses.field(default_factory=dict)
    """Batches sent (or to send on connection), not yet answered, in order."""
    held: list[BatchTask] = dataclasses.field(default_factory=list)
    """Batches given while the stream moves to another worker, sent once it is there."""
    outbox: collections.deque[dict[str, Any]] = dataclasses.field(
        default_factory=collections.deque)
    writing: bool = False
    moving_to: str | None = None
    starts_without_a_batch: int = 0
    started: float = 0.0


class StreamSet:
    """The streams of one run (see the module docstring)."""

    def __init__(self, client: Client, plugin_name: str, key_prefix: str, workers: Workers,
                 placement: list[str], inbox: Inbox) -> None:
        self.client = client
        self.plugin_name = plugin_name
        self.key_prefix = key_prefix
        self.workers = workers
        self.inbox = inbox
        self.streams = [_Stream(s, w) for s, w in enumerate(placement)]
        self.token = uuid.uuid4().hex
        self.listener = Listener(client, self.token, self._on_open, self._on_message,
                                 self._on_close)
        self.address = ""
        self.newest: tuple[int, WeightsRef] | None = None
        self.closing = False
        self.restarts = 0
        """Stream starts after the first (lost workers, moves)."""
        self._tasks: set[asyncio.Future[Any]] = set()  # writing to channels, cancelling tasks

    # -- starting ----------------------------------------------------------------------------
    async def start(self) -> None:
        """Listen, and start every stream's task."""
        self.address = await self.listener.start()
        for s in self.streams:
            self._submit(s)

    def _submit(self, s: _Stream) -> None:
        spec = StreamSpec(stream=s.index, epoch=s.epoch, learner=self.address, token=self.token,
                          connect_timeout=self.workers.call_timeout)
        s.started = time.monotonic()
        s.future = self.client.submit(
            run_stream, self.plugin_name, spec,
            key=f"daskrl-stream-{self.key_prefix}-{s.index}-e{s.epoch}",
            workers=[s.worker], allow_other_workers=False, pure=False)

    async def wait_connected(self, timeout: float) -> None:
        """Wait until every stream is connected; raise the error of a stream task that failed
        meanwhile (e.g. its worker cannot reach the listener: a
        :class:`~daskrl.errors.StreamError`). After ``timeout`` seconds (a stream task that
        has not started: a busy worker) the collection goes on, and the health check deals
        with the stream."""
        deadline = time.monotonic() + timeout
        while any(s.comm is None for s in self.streams):
            for s in self.streams:
                if s.comm is None and s.future is not None and s.future.status == "error":
                    await s.future  # raises the stream's error
            if time.monotonic() > deadline:
                waiting = [s.index for s in self.streams if s.comm is None]
                logger.warning("streams %s have not connected within %gs; collecting on",
                               waiting, timeout)
                return
            await asyncio.sleep(0.01)

    # -- the learner's side ------------------------------------------------------------------
    def give(self, task: BatchTask) -> None:
        """Send ``task`` to its stream (a credit: the stream runs it when it can)."""
        s = self.streams[task.stream]
        if s.moving_to is not None:
            s.held.append(task)
            return
        s.sent[task.batch_id] = task
        if s.comm is not None:
            self._send(s, batch_message(task, self.newest))

    def announce(self, version: int, weights: WeightsRef) -> None:
        """Tell every stream of a new weights version."""
        self.newest = (version, weights)
        for s in self.streams:
            if s.comm is not None:
                self._send(s, self._weights_message())

    def _weights_message(self) -> dict[str, Any]:
        assert self.newest is not None
        return {"op": "weights", "version": self.newest[0], "weights": to_serialize(self.newest[1])}

    def _send(self, s: _Stream, msg: dict[str, Any]) -> None:
        s.outbox.append(msg)
        if not s.writing:
            self._start_drain(s)

    def _start_drain(self, s: _Stream) -> None:
        s.writing = True
        self._background(self._drain(s, s.comm))

    def _background(self, awaitable: Any) -> None:
        """Run ``awaitable`` on the loop, holding it until it is done."""
        task = asyncio.ensure_future(awaitable)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drain(self, s: _Stream, comm: Any) -> None:
        try:
            while s.outbox and s.comm is comm:
                await comm.write(s.outbox.popleft())
        except (CommClosedError, OSError):
            pass  # the listener sees the channel close, and the stream starts again
        finally:
            if s.comm is comm:
                s.writing = False

    # -- the listener's callbacks ------------------------------------------------------------
    def _on_open(self, stream: int, epoch: int, comm: Any) -> bool:
        if self.closing or not 0 <= stream < len(self.streams):
            return False
        s = self.streams[stream]
        if epoch != s.epoch:
            return False
        s.comm = comm
        s.outbox.clear()
        if self.newest is not None:
            s.outbox.append(self._weights_message())
        s.outbox.extend(batch_message(t, self.newest) for t in s.sent.values())
        if s.outbox and not s.writing:
            self._start_drain(s)
        return True

    def _on_message(self, stream: int, epoch: int, msg: dict[str, Any]) -> None:
        s = self.streams[stream]
        if epoch != s.epoch:
            return  # an older epoch's last words: its batches were sent again
        task = s.sent.pop(int(msg.get("batch_id", -1)), None)
        if task is None:
            return  # taken back, or answered already
        s.starts_without_a_batch = 0
        if msg["op"] == "handle":
            self.inbox.put(("handle", BatchHandle.from_wire(msg["h"]), task))
        else:
            self.inbox.put(("error", msg["error"], task))
        if s.moving_to is not None and not s.sent:
            self._restart(s, "it moves to a joining worker", s.moving_to)

    def _on_close(self, stream: int, epoch: int) -> None:
        s = self.streams[stream]
        if epoch == s.epoch and not self.closing:
            s.comm = None
            self._restart(s, "its channel to the learner closed")

    # -- supervision -------------------------------------------------------------------------
    def _restart(self, s: _Stream, why: str, worker: str | None = None) -> None:
        """Start stream ``s`` again (on ``worker``, else where the placement puts it)."""
        old, comm = s.future, s.comm
        s.epoch += 1
        s.comm, s.writing = None, False
        s.outbox.clear()
        live = self.workers.live
        s.worker = worker or stream_placement(self._placement(), s.index, live)
        s.moving_to = None
        for task in s.held:
            s.sent[task.batch_id] = task
        s.held.clear()
        s.starts_without_a_batch += 1
        self.restarts += 1
        if comm is not None:
            comm.abort()
        if old is not None:
            self._background(self.client.cancel([old]))
        if s.starts_without_a_batch > MAX_STARTS_WITHOUT_A_BATCH:
            s.future = None
            self.inbox.fail(StreamError(
                f"stream {s.index} was started {MAX_STARTS_WITHOUT_A_BATCH} times in a row "
                f"without collecting a batch (last: {why}). Check the workers' logs."))
            return
        logger.info("stream %d starts again on %s: %s", s.index, s.worker, why)
        self._submit(s)

    def _placement(self) -> list[str]:
        """Each stream's worker, or the one it is moving to."""
        return [t.moving_to or t.worker for t in self.streams]

    async def check(self, live: set[str]) -> None:
        """Start again the streams whose worker left, was cut off or whose task ended; move
        one to a joining worker (see the module docstring)."""
        if self.closing or not live:
            return
        placement = Placement(self._placement(), live)
        for s in self.streams:
            fut = s.future
            if s.worker not in live:
                self._restart(s, f"its worker {s.worker} left or does not answer")
                placement = Placement(self._placement(), live)  # (rare) counted again
            elif fut is not None and fut.done():
                if fut.status == "error" and s.comm is None:
                    error = await fut.exception()
                    if not _worker_lost(error):
                        self.inbox.fail(error)
                        return
                self._restart(s, f"its task ended ({fut.status})")
                placement = Placement(self._placement(), live)
            elif s.moving_to is None and s.comm is not None:
                there = placement.worker(s.index)
                if there != s.worker:
                    if s.sent:
                        s.moving_to = there
                    else:
                        self._restart(s, "it moves to a joining worker", there)

    async def close(self) -> None:
        """Stop every stream and the listener."""
        self.closing = True
        futures = [s.future for s in self.streams if s.future is not None]
        for s in self.streams:
            if s.comm is not None:
                try:
                    await asyncio.wait_for(s.comm.write({"op": "stop"}), 1.0)
                except Exception:  # closed already, or a worker cut off
                    pass
                s.comm.abort()
                s.comm = None
        self.listener.stop()
        if futures:
            await self.client.cancel(futures)


def _worker_lost(error: BaseException | None) -> bool:
    """Whether a stream task's error means its worker went away (start it elsewhere)."""
    from distributed.scheduler import KilledWorker

    return error is None or isinstance(error, (KilledWorker, CommClosedError))
