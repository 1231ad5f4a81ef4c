"""A collector's lifecycle state, and what closing it frees.

:class:`Closing` is what ``close()`` returns: with an asynchronous client, awaited to close.
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

__all__ = ["Closing", "State", "field_values", "finalize", "release"]

logger = logging.getLogger(__name__)


class State(enum.Enum):
    """Where a collector is in its life."""

    CREATED = "created"
    """Checked on the learner; with an asynchronous client, waiting for ``await``."""
    STARTING = "starting"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


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
