"""The embedded cluster: a ``LocalCluster`` set up for collection on this machine.

Anyone who can reach a Dask scheduler can run code on its workers and its clients; on a shared
login node even ``127.0.0.1`` is reachable by other users. So the embedded cluster speaks TLS
with temporary credentials held by this process only, unless told otherwise:
``local_cluster(tls=False)``, ``daskrl collect --no-tls``, or the dask config key
``daskrl.embedded-cluster.tls: false`` (env ``DASK_DASKRL__EMBEDDED_CLUSTER__TLS=False``).
"""

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
                  tls: bool | None = None, **kwargs: Any) -> LocalCluster:
    """A ``LocalCluster`` of ``n_workers`` one-thread workers (default: one per core).

    Workers are spawn-started processes (``processes=True``), which is safe on macOS and
    Windows as long as the calling script guards its entry point with
    ``if __name__ == "__main__":``. With ``tls`` (default: the dask config key
    ``daskrl.embedded-cluster.tls``, true unless set) the cluster uses TLS with temporary
    credentials (``distributed.security.Security.temporary``), so only this process can
    connect. ``kwargs`` go to ``LocalCluster``.
    """
    n = n_workers or max(1, os.cpu_count() or 1)
    options: dict[str, Any] = {"threads_per_worker": 1, "dashboard_address": None,
                               "silence_logs": logging.WARNING}
    if tls is None:
        tls = bool(dask.config.get("daskrl.embedded-cluster.tls", True))
    if tls and processes and "security" not in kwargs:
        from distributed.security import Security

        try:
            options["security"] = Security.temporary()
        except ImportError as e:
            raise ImportError(
                "the embedded cluster uses TLS, which needs the 'cryptography' package: "
                'pip install "daskrl[tls]" (or local_cluster(tls=False) to opt out).'
            ) from e
        options["protocol"] = "tls://"
    options.update(kwargs)
    with dask.config.set(WORKER_CONFIG):
        return LocalCluster(n_workers=n, processes=processes, **options)
