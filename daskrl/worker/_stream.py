"""A stream: one long-lived task per env stream that collects batch after batch.

:func:`run_stream` is the only Dask task of an iterated collection's stream: the scheduler
hears of it when the stream starts, moves or ends, not once per batch. It leaves the worker's
task slots (``secede``), connects to the learner's listener
(:mod:`daskrl.collect._channel`) over ``distributed.comm`` (the cluster's TLS and
serialization, no scheduler in between), and then loops: it waits for the learner's next
:class:`~daskrl.worker._tasks.BatchTask` (a credit: the learner sends ``batches_in_flight``
of them ahead, so a slow learner slows the stream), collects it with
:func:`~daskrl.worker._tasks.collect_batch`, and sends back the handle, or the error.

Between two batches the stream also takes the learner's weights announcements: a batch that
may run on a newer version (``newest_ok``, ``sync=False``) runs on the newest one announced.

Messages, learner to worker: ``{"op": "batch", "t", "w"}`` (:func:`batch_message`),
``{"op": "weights", "version", "weights"}``, ``{"op": "stop"}``; worker to learner: ``{"op":
"hello", "token", "stream", "epoch", "worker"}`` (answered ``{"op": "ok"}`` or ``{"op":
"refused"}``), ``{"op": "handle", "batch_id", "h"}`` (``BatchHandle.to_wire``), ``{"op":
"error", "batch_id", "error"}``. A batch and a handle, one of each per batch, travel as plain
values (msgpack), not pickled: pickling a handle cost its worker ~0.1-0.3 ms and the
learner's loads ~0.06 ms, a batch's dumps ~0.07 ms.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
from typing import Any

from distributed import Worker, secede
from distributed.comm import CommClosedError, connect
from distributed.protocol import to_serialize
from distributed.utils import sync

from daskrl._distributed import running_task_cancelled, this_worker
from daskrl.errors import CollectorClosedError, StreamError
from daskrl.weights._cache import WeightsRef
from daskrl.worker._plugin import CollectorPlugin, collector_plugin
from daskrl.worker._tasks import BatchTask, collect_batch

__all__ = ["CONNECT_TIMEOUT_S", "StreamSpec", "run_stream"]

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 30.0
"""How long a stream tries to reach the learner's listener before it gives up (unless its
spec says otherwise)."""

POLL_S = 0.5
"""How often a stream waiting for its next batch checks whether it was cancelled."""

_CLOSED = object()  # the channel's end, in the inbox


def batch_message(task: BatchTask, announced: tuple[int, WeightsRef] | None) -> dict[str, Any]:
    """The learner's message giving ``task`` to its stream: its fields as plain values, and
    its weights' ref only where it is not the one last announced to the stream
    (``announced``; the stream has that one)."""
    known = (announced is not None and announced[0] == task.weights_version
             and announced[1] == task.weights)
    return {"op": "batch",
            "t": (task.batch_id, task.stream, task.previous_batch_id, task.steps,
                  task.random_steps, task.weights_version, task.env, task.newest_ok),
            "w": None if known else to_serialize(task.weights)}


def read_batch(msg: dict[str, Any], announced: tuple[int, WeightsRef] | None) -> BatchTask:
    """The task of a :func:`batch_message`, its weights' ref taken from ``announced`` where
    the message has none."""
    batch_id, stream, previous, steps, random_steps, version, env, newest_ok = msg["t"]
    weights = msg["w"]
    if weights is None:
        if announced is None or announced[0] != version:
            raise StreamError(
                f"batch {batch_id} came without its weights version {version}, which was not "
                "announced to this stream (learner and worker of different daskrl versions?)")
        weights = announced[1]
    return BatchTask(batch_id=batch_id, stream=stream, previous_batch_id=previous,
                     steps=steps, random_steps=random_steps, weights_version=version,
                     weights=weights, env=env, newest_ok=newest_ok)


@dataclasses.dataclass(frozen=True)
class StreamSpec:
    """What a stream task needs to find its learner."""

    stream: int
    epoch: int
    """The learner's count of this stream's starts: a stream of an older epoch is refused."""
    learner: str
    """The learner's listener address."""
    token: str
    """The collection's secret: the listener accepts streams that know it."""
    connect_timeout: float = CONNECT_TIMEOUT_S
    """How long to try to reach the learner (the collection's ``call_timeout``)."""


class _Channel:
    """The stream's connection to the learner, used from the stream's thread: messages are
    read on the worker's event loop into a thread-safe inbox."""

    def __init__(self, worker: Worker, spec: StreamSpec) -> None:
        self.worker = worker
        self.spec = spec
        self.inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.newest: tuple[int, WeightsRef] | None = None
        self.comm = sync(worker.loop, self._open)

    async def _open(self) -> Any:
        try:
            comm = await connect(self.spec.learner, timeout=self.spec.connect_timeout,
                                 **self.worker.connection_args)
        except OSError as e:
            raise StreamError(
                f"worker {self.worker.address} cannot reach the learner at "
                f"{self.spec.learner}: {e}. Streams send their batches straight to the learner: "
                "the workers must be able to connect to the learner's host (set "
                "daskrl.learner.host in the Dask config to the address they reach it at).") from e
        await comm.write({"op": "hello", "token": self.spec.token, "stream": self.spec.stream,
                          "epoch": self.spec.epoch, "worker": self.worker.address})
        answer = await comm.read()
        if answer.get("op") != "ok":
            comm.abort()
            return None
        self.worker.loop.add_callback(self._read, comm)
        return comm

    async def _read(self, comm: Any) -> None:
        try:
            while True:
                self.inbox.put(await comm.read())
        except (CommClosedError, OSError):
            pass
        finally:
            self.inbox.put(_CLOSED)

    def next_task(self, cancelled: Any) -> BatchTask | None:
        """The learner's next batch; None once it says stop, the channel closed, or
        ``cancelled()``."""
        while True:
            try:
                msg = self.inbox.get(timeout=POLL_S)
            except queue.Empty:
                if cancelled():
                    return None
                continue
            if msg is _CLOSED or msg.get("op") == "stop":
                return None
            if msg.get("op") == "weights":  # the last announced wins (as on the learner)
                if self.newest is None or msg["version"] >= self.newest[0]:
                    self.newest = (msg["version"], msg["weights"])
                continue
            task = read_batch(msg, self.newest)
            if task.newest_ok and self.newest is not None and \
                    self.newest[0] > task.weights_version:
                task = dataclasses.replace(task, weights_version=self.newest[0],
                                           weights=self.newest[1])
            return task

    def send(self, msg: dict[str, Any]) -> bool:
        """Send ``msg``; False if the channel is closed."""
        try:
            sync(self.worker.loop, self.comm.write, msg)
        except (CommClosedError, OSError):
            return False
        return True

    def close(self) -> None:
        if self.comm is not None and not self.comm.closed():
            self.worker.loop.add_callback(self.comm.close)


def run_stream(plugin_name: str, spec: StreamSpec) -> int:
    """Collect the learner's batches for stream ``spec.stream`` until it says stop, the
    channel closes or the task is cancelled; return the number of batches sent."""
    worker = this_worker()
    collector_plugin(worker, plugin_name)  # the collector's plugin is here, or raise now
    secede()  # long-running: the worker's task slots stay free for other tasks
    channel = _Channel(worker, spec)
    if channel.comm is None:  # refused: a newer epoch of this stream runs elsewhere
        return 0
    sent = 0

    def cancelled() -> bool:
        plugin = worker.plugins.get(plugin_name)
        return (not isinstance(plugin, CollectorPlugin) or plugin.closed
                or running_task_cancelled(worker))

    try:
        while (task := channel.next_task(cancelled)) is not None:
            try:
                handle = collect_batch(plugin_name, task)
            except CollectorClosedError:
                return sent
            except Exception as e:  # the learner decides: raise it, or send the batch again
                if not channel.send({"op": "error", "batch_id": task.batch_id,
                                     "error": to_serialize(e)}):
                    return sent
            else:
                if handle is None:  # cancelled while it ran
                    return sent
                if not channel.send({"op": "handle", "batch_id": task.batch_id,
                                     "h": handle.to_wire()}):
                    return sent
            sent += 1
        return sent
    finally:
        channel.close()
