"""A collector's lifecycle state, and the awaitable results of its calls.

Every cluster operation of a collector is one coroutine. With a synchronous client the
collector runs it to completion on the client's event loop before returning; with an
asynchronous one it hands back an awaitable. :class:`WeightsVersion` and :class:`Closing` say
so in their types: a version number that can also be awaited, and a close that can be.
"""

from __future__ import annotations

import enum
from collections.abc import Coroutine, Generator
from typing import Any

__all__ = ["Closing", "State", "WeightsVersion"]


class State(enum.Enum):
    """Where a collector is in its life."""

    CREATED = "created"
    """Checked on the learner; with an asynchronous client, waiting for ``await``."""
    STARTING = "starting"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


class WeightsVersion(int):
    """The number of a weights version :meth:`~daskrl.Collector.update_weights` published.

    It is an ``int``. With an asynchronous client, publishing goes on in the event loop: await
    it (``await collector.update_weights(policy)`` is the version number) before the next
    update. With a synchronous client the version is published already; awaiting it returns
    at once.
    """

    _publishing: Coroutine[Any, Any, int] | None

    def __new__(cls, version: int,
                publishing: Coroutine[Any, Any, int] | None = None) -> WeightsVersion:
        obj = super().__new__(cls, version)
        obj._publishing = publishing
        return obj

    def __await__(self) -> Generator[Any, None, int]:
        publishing, self._publishing = self._publishing, None
        if publishing is not None:
            yield from publishing.__await__()
        return int(self)


class Closing:
    """What :meth:`~daskrl.Collector.close` returns: with a synchronous client the collector
    is closed already (ignore it); with an asynchronous one, ``await`` it to close."""

    def __init__(self, closing: Coroutine[Any, Any, None] | None = None) -> None:
        self._closing = closing

    def __await__(self) -> Generator[Any, None, None]:
        closing, self._closing = self._closing, None
        if closing is not None:
            yield from closing.__await__()
