"""The embedded cluster: a ``LocalCluster`` set up for collection on this machine."""

from __future__ import annotations

import logging
import os
from typing import Any

import dask
from distributed import LocalCluster

__all__ = ["WORKER_CONFIG", "local_cluster"]

WORKER_CONFIG: dict[str, Any] = {
    # The statistical profiler samples every task thread's stack each 10 ms, and the event
    # loop's health tick wakes every 20 ms: both take the GIL from the rollout loop.
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "500ms",
}
"""Dask settings of the embedded cluster's workers (deployment knobs, not algorithm ones)."""


def local_cluster(n_workers: int | None = None, *, processes: bool = True,
                  **kwargs: Any) -> LocalCluster:
    """A ``LocalCluster`` of ``n_workers`` one-thread workers (default: one per core).

    Workers are spawn-started processes (``processes=True``), which is safe on macOS and
    Windows as long as the calling script guards its entry point with
    ``if __name__ == "__main__":``. ``kwargs`` go to ``LocalCluster``.
    """
    n = n_workers or max(1, os.cpu_count() or 1)
    options: dict[str, Any] = {"threads_per_worker": 1, "dashboard_address": None,
                               "silence_logs": logging.WARNING}
    options.update(kwargs)
    with dask.config.set(WORKER_CONFIG):
        return LocalCluster(n_workers=n, processes=processes, **options)
