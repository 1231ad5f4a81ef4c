"""``update_weights``' versions, in call order, whichever kind of client runs them.

The weights are copied when :meth:`~daskrl.Collector.update_weights` is called (the learner
may change them in place right after); the copy is published when the update runs: at once
with a synchronous client, when its awaitable is awaited with an asynchronous one. Versions are
numbered in call order and published in that order, none skipped, so the published versions
are 0, 1, 2, ... whatever is awaited when, or never: running an update first publishes every
update called before it and not published yet. An update whose publishing fails takes those
called after it along (their copies are released and their numbers given again); awaiting one
of those raises :class:`~daskrl.errors.ClusterError`.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses

import torch

from daskrl.collect._run import Run
from daskrl.errors import ClusterError, CollectorClosedError
from daskrl.weights._publish import WeightsPublisher
from daskrl.weights._snapshot import WeightsSnapshot

__all__ = ["Update", "WeightsUpdates"]


@dataclasses.dataclass(eq=False)
class Update:
    """One ``update_weights`` call: its copy of the weights, and why it was not published
    (None while it may still be)."""

    snap: WeightsSnapshot
    wait: bool
    error: BaseException | None = None

    @property
    def version(self) -> int:
        return self.snap.version


class WeightsUpdates:
    """The updates of one collector taken and not yet published (see the module docstring)."""

    def __init__(self, weights: WeightsPublisher) -> None:
        self.weights = weights
        self.pending: collections.deque[Update] = collections.deque()
        self._last = -1  # the newest version taken (the publisher's, if newer: version 0)
        self._lock: asyncio.Lock | None = None  # made on the client's event loop

    def take(self, policy: torch.nn.Module, wait: bool) -> Update:
        """Copy ``policy``'s weights now, as the version after the last one taken (counted
        here: one being published may be the newest already and still pending)."""
        version = max(self._last, self.weights.version) + 1
        update = Update(self.weights.take_snapshot(policy, version), wait)
        self.pending.append(update)
        self._last = version
        return update

    async def publish(self, run: Run, update: Update) -> int:
        """Publish ``update``, after every update taken before it; return its version."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            while update.error is None and self.weights.version < update.version:
                head = self.pending[0]
                try:
                    await run.publish(head.snap, head.wait)
                except BaseException as e:
                    if self.weights.version < head.version:  # not published
                        self._drop(e)
                    else:  # published; loading it on every worker (wait=True) failed
                        self.pending.popleft()
                    raise
                self.pending.popleft()
        if isinstance(update.error, CollectorClosedError):
            raise update.error
        if update.error is not None:
            raise ClusterError(
                f"weights version {update.version} was not published: publishing an earlier "
                f"version failed ({type(update.error).__name__}: {update.error}). Call "
                "update_weights again.") from update.error
        return update.version

    def _drop(self, error: BaseException) -> None:
        """Give up every pending update: release their copies, free their numbers."""
        while self.pending:
            dropped = self.pending.pop()
            dropped.error = error
            self.weights.segments.release(dropped.version)
        self._last = self.weights.version

    def close(self) -> None:
        """The collector closed: updates not published yet never will be."""
        self._drop(CollectorClosedError(
            "this collector was closed before these weights were published; create a new one."))
