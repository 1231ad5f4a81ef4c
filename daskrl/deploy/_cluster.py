"""The embedded cluster: a ``LocalCluster`` set up for collection on this machine.

Anyone who can reach a Dask scheduler can run code on its workers and its clients; on a shared
login node even ``127.0.0.1`` is reachable by other users. So the embedded cluster speaks TLS
with temporary credentials held by this process only, unless told otherwise:
``local_cluster(tls=False)``, ``daskrl collect --no-tls``, or the dask config key
``daskrl.embedded-cluster.tls: false`` (env ``DASK_DASKRL__EMBEDDED_CLUSTER__TLS=False``).

Dask's scheduler and every worker also serve plain, unauthenticated HTTP (the scheduler's
``/info`` pages with worker logs, the workers' ``/metrics`` and ``/health``) even without a
dashboard. The embedded cluster closes those servers unless a dashboard is asked for
(``dashboard=True`` or a port: the scheduler's, on ``127.0.0.1``; ``dashboard_address=``,
``worker_dashboard_address=`` for any address): only the TLS comm ports of the scheduler, the
nannies and the workers listen (see ``docs/security.md``). The dashboard needs bokeh
(``daskrl[dashboard]``).

The embedded cluster's worker processes may start processes of their own (gymnasium's
``AsyncVectorEnv``): Dask starts them as daemonic processes, which cannot, unless the dask config
key ``distributed.worker.daemon`` is false where the nanny starts them.  :class:`ParentNanny`
sets it while it starts (and restarts) its worker, and nothing else; other clusters set it in
the workers' dask config (``DASK_DISTRIBUTED__WORKER__DAEMON=False``, see ``docs/env-kinds.md``).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import dask
from distributed import LocalCluster

from daskrl.deploy import _forkserver
from daskrl.deploy._nanny import EmbeddedNanny, ParentNanny
from daskrl.errors import ConfigError, MissingDependencyError

__all__ = ["DASHBOARD_PORT", "WORKER_CONFIG", "ParentNanny", "dashboard_link", "dask_setup",
           "local_cluster", "require_bokeh"]

logger = logging.getLogger(__name__)

DASHBOARD_PORT = 8787
"""Port of ``dashboard=True`` (Dask's own default); the next free one when it is taken."""

WORKER_CONFIG: dict[str, Any] = {
    # The statistical profiler samples every task thread's stack each 10 ms, and the event
    # loop's health tick wakes every 20 ms: both take the GIL from the rollout loop.
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "500ms",
    # Each nanny's memory monitor (a psutil reading of its worker every 100 ms, in the learner's
    # process) and each server's system monitor (every 500 ms): an idle 2-worker cluster cost
    # 14 ms/s of CPU in the learner and 7.5 ms/s in each worker; with these, 8 and 3.6. The
    # nanny still stops a worker over its memory limit, within half a second.
    "distributed.worker.memory.monitor-interval": "500ms",
    "distributed.admin.system-monitor.interval": "2s",
}
"""Dask settings of the embedded cluster's workers (deployment knobs, not algorithm ones)."""

_PRELOAD = __name__
"""This module is the preload (``dask_setup``) that closes a server's HTTP listener."""

_WORKER_PRELOAD = "daskrl.deploy._worker_preload"
"""The workers' preload that imports what they run while they start."""


def dask_setup(server: Any) -> None:
    """Dask preload hook: close ``server``'s HTTP listener (scheduler or worker).

    Dask starts an HTTP server on every scheduler and worker, dashboard or not, before it runs
    preloads; the embedded cluster starts them with no routes (every request gets 404) and this
    hook, run before the server is handed over, stops them listening.
    """
    http = getattr(server, "http_server", None)
    if http is not None:
        http.stop()  # closes the listening sockets
        server.services.pop("dashboard", None)  # advertise no port that is closed


def _closed_http_config(scheduler: bool, workers: bool) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for role, close in (("scheduler", scheduler), ("worker", workers)):
        if close:
            preload = dask.config.get(f"distributed.{role}.preload") or []
            preload = [preload] if isinstance(preload, str) else list(preload)
            config[f"distributed.{role}.http.routes"] = []
            config[f"distributed.{role}.preload"] = [*preload, _PRELOAD]
    return config


def _dashboard_address(dashboard: bool | int | None) -> str | None:
    """The loopback address ``dashboard`` asks for: ``True`` :data:`DASHBOARD_PORT`, a port
    (``0``: any free one), ``False``/``None`` none; raises :class:`~daskrl.ConfigError` for
    anything else."""
    if dashboard is None or dashboard is False:
        return None
    port = DASHBOARD_PORT if dashboard is True else dashboard
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"dashboard must be True, False or a port 0-65535 (0: any free "
                          f"port), got {dashboard!r}.")
    return f"127.0.0.1:{port}"


def require_bokeh() -> None:
    """Raise :class:`~daskrl.MissingDependencyError` unless Dask can serve its dashboard
    (bokeh installed, in a version Dask accepts)."""
    try:
        import distributed.dashboard.scheduler  # noqa: F401  (imports bokeh, checks its version)
    except ImportError as e:
        raise MissingDependencyError(
            f"the Dask dashboard needs bokeh ({e}): pip install \"daskrl[dashboard]\" (or "
            "collect without the dashboard)."
        ) from e


def dashboard_link(cluster: Any) -> str | None:
    """The link to the dashboard ``cluster`` serves, at the address its HTTP server is bound to
    (``http://127.0.0.1:PORT/status``, or as the dask config key ``distributed.dashboard.link``
    formats it); None when it serves none."""
    from distributed.utils import format_dashboard_link

    scheduler = getattr(cluster, "scheduler", None)
    server = getattr(scheduler, "services", {}).get("dashboard")
    if server is None:
        return None
    host = getattr(server, "address", None)
    if host in (None, "", "0.0.0.0", "::"):  # every interface: distributed names a host
        return str(cluster.dashboard_link) or None
    return str(format_dashboard_link(f"[{host}]" if ":" in host else host, server.port))


def check_main_importable() -> None:
    """Raise :class:`~daskrl.ConfigError` if the embedded cluster's worker processes could not
    start: they import this program's main module again (spawned, or from the forkserver), and a
    program read from standard input (``python - <<EOF``) has none to import, so every nanny
    would fail with an opaque ``FileNotFoundError``. Forked workers (the dask config key
    ``distributed.worker.multiprocessing-method: fork``) import nothing again."""
    if dask.config.get(_forkserver.METHOD_KEY, "spawn") == "fork":
        return
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None):  # python -m: imported by name
        return
    path = getattr(main, "__file__", None)
    if isinstance(path, str) and path.startswith("<"):
        raise ConfigError(
            f"the embedded cluster's worker processes start by importing this program's main "
            f"module, and this program was read from {path}, which they cannot import: save it "
            "to a file and run that file (with its entry point under "
            "if __name__ == \"__main__\":), or pass client= a Client of a cluster started "
            "otherwise (dask scheduler / dask worker)."
        )


def local_cluster(n_workers: int | None = None, *, processes: bool = True,
                  tls: bool | None = None, dashboard: bool | int | None = None,
                  dashboard_address: str | None = None, **kwargs: Any) -> LocalCluster:
    """A ``LocalCluster`` of ``n_workers`` one-thread workers (default: one per core).

    Workers are processes of their own (``processes=True``), forked from a forkserver that
    imported distributed, torch, gymnasium and daskrl's worker side once
    (:mod:`daskrl.deploy._forkserver`; spawned where there is none, e.g. Windows, or with the
    dask config key ``daskrl.embedded-cluster.forkserver: false``), which is safe on macOS and
    Windows as long as the calling script guards its entry point with
    ``if __name__ == "__main__":``; a program read from standard input, which they cannot import,
    is refused with :class:`~daskrl.ConfigError` before any of them starts. With ``tls``
    (default: the dask config key ``daskrl.embedded-cluster.tls``, true unless set) the cluster
    uses TLS with temporary credentials (``distributed.security.Security.temporary``), so only
    this process can connect. Dask's own log records below the dask config key
    ``daskrl.embedded-cluster.log-level`` (default ``"warning"``) are dropped in every process
    of the cluster. Only the comm ports listen: the scheduler's and workers' HTTP servers are
    closed, unless ``dashboard`` asks for the scheduler's dashboard on ``127.0.0.1`` (``True``:
    port 8787, or the next free one; a port; ``0``: any free port), or ``dashboard_address`` at
    any address (e.g. ``"127.0.0.1:8787"``), or ``worker_dashboard_address`` for the workers'.
    The dashboard needs bokeh (:class:`~daskrl.MissingDependencyError` otherwise); its link is
    ``cluster.dashboard_link`` (``""`` without one), also logged at INFO by
    ``daskrl.deploy._cluster``. Dashboards are plain HTTP without authentication: anyone who can
    reach the address can read them (see ``docs/security.md``). The nannies are
    :class:`~daskrl.deploy._nanny.EmbeddedNanny`: their worker processes may start processes of
    their own (an ``AsyncVectorEnv``: :class:`ParentNanny`), and a started worker's queues hold
    no named semaphore, so a killed learner leaves no ``/dev/shm/sem.mp-*`` files. ``kwargs`` go
    to ``LocalCluster``.
    """
    if (dashboard is not None and dashboard is not False) and dashboard_address is not None:
        raise ConfigError(f"pass dashboard= or dashboard_address=, not both (got {dashboard!r} "
                          f"and {dashboard_address!r}).")
    dashboard_address = dashboard_address or _dashboard_address(dashboard)
    if dashboard_address is not None:
        require_bokeh()
    if processes:
        check_main_importable()
    n = n_workers or max(1, os.cpu_count() or 1)
    level = str(dask.config.get("daskrl.embedded-cluster.log-level", "warning")).upper()
    options: dict[str, Any] = {"threads_per_worker": 1, "dashboard_address": dashboard_address,
                               "silence_logs": logging.getLevelName(level)}
    if tls is None:
        tls = bool(dask.config.get("daskrl.embedded-cluster.tls", True))
    if tls and processes and "security" not in kwargs:
        from distributed.security import Security

        try:
            options["security"] = Security.temporary()
        except ImportError as e:
            raise MissingDependencyError(
                "the embedded cluster uses TLS, which needs the 'cryptography' package (a "
                'dependency of daskrl): pip install "cryptography>=42", or opt out with '
                "local_cluster(tls=False)."
            ) from e
        options["protocol"] = "tls://"
    no_dashboard = dashboard_address is None
    if no_dashboard:
        # Dask binds the scheduler's HTTP server to port 8787 (or the next free one) even
        # without a dashboard: bind it to a random loopback port instead, until it is closed.
        scheduler_kwargs = dict(kwargs.pop("scheduler_kwargs", None) or {})
        scheduler_kwargs.setdefault("dashboard_address", "127.0.0.1:0")
        scheduler_kwargs.setdefault("dashboard", False)
        options["scheduler_kwargs"] = scheduler_kwargs
    config = {**WORKER_CONFIG,
              **_closed_http_config(no_dashboard, kwargs.get("worker_dashboard_address") is None)}
    if processes:  # worker processes import torch and daskrl's worker side as they start
        preload = config.get("distributed.worker.preload",
                             dask.config.get("distributed.worker.preload") or [])
        preload = [preload] if isinstance(preload, str) else list(preload)
        config["distributed.worker.preload"] = [*preload, _WORKER_PRELOAD]
    if processes and "worker_class" not in kwargs:
        options["worker_class"] = EmbeddedNanny
    options.update(kwargs)
    with dask.config.set(config):
        cluster = LocalCluster(n_workers=n, processes=processes, **options)
    link = dashboard_link(cluster)
    if link:
        logger.info("the embedded cluster's dashboard: %s", link)
    return cluster
