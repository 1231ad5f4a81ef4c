"""A collector's lifecycle state, and the awaitable results of its calls.

Every cluster operation of a collector is one coroutine. With a synchronous client the
collector runs it to completion on the client's event loop before returning; with an
asynchronous one it hands back an awaitable. :class:`WeightsVersion` and :class:`Closing` say
so in their types: a version number that can also be awaited, and a close that can be.
:func:`release` and :func:`finalize` free what a collector holds on the cluster.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Coroutine, Generator
from typing import Any

from distributed import Client, LocalCluster

from daskrl.collect._supervisor import Workers, scheduler
from daskrl.config import CollectorConfig
from daskrl.weights._publish import WeightsPublisher

__all__ = ["Closing", "State", "WeightsVersion", "field_values", "finalize", "release"]

logger = logging.getLogger(__name__)


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


async def release(client: Client, plugin_name: str, weights: WeightsPublisher,
                   timeout: float) -> None:
    """Unpublish every weights version and unregister the worker plugin."""
    workers = Workers(client, timeout, [])
    await weights.close(workers if client.status == "running" else None)
    if client.status != "running":
        return
    try:  # the scheduler tells every worker (a cut-off one too): bounded
        await workers.bounded("unregistering the worker plugin",
                              scheduler(client).unregister_worker_plugin(name=plugin_name))
    except Exception:  # never registered, or the cluster is gone
        logger.debug("could not unregister %s", plugin_name, exc_info=True)


def finalize(client: Client, cluster: LocalCluster | None, asynchronous: bool,
              plugin_name: str, weights: WeightsPublisher, timeout: float) -> None:
    """Release what a collector holds (run by close(), or when it is garbage-collected)."""
    if not asynchronous:  # an asynchronous client's loop cannot be waited on here
        try:
            if client.status == "running" and (weights.snapshots or weights.futures):
                client.sync(release, client, plugin_name, weights, timeout)
        except Exception:  # the cluster may already be gone
            logger.debug("could not release %s", plugin_name, exc_info=True)
    weights.segments.close()
    if cluster is not None:
        client.close()
        cluster.close()


def field_values(config: CollectorConfig) -> dict[str, Any]:
    """A config's fields (shallow: its mappings stay as they are)."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
