"""The embedded cluster's worker processes, forked from a ``multiprocessing`` forkserver that has
imported what a worker runs (distributed, torch, gymnasium, daskrl's worker side) once.

Spawned, every worker process starts a fresh interpreter and imports torch on its own: on a
small machine the workers' imports, one each, are most of ``daskrl collect``'s start-up. The
forkserver imports them once and forks each worker (restarts included) from that state; each
worker is still a process of its own (a crash ends only it), its nanny still ends it, and it
still exits when the learner dies (Dask's parent-alive pipe). The learner itself never forks:
``multiprocessing`` starts the forkserver with ``fork``+``exec``, as ``subprocess`` does.

Rules that keep the forked workers as the spawned ones were:

* the forkserver runs with the nanny's pre-spawn environment (``distributed.nanny.pre-spawn-
  environ``: ``OMP_NUM_THREADS=1`` etc., ``PYTHONHASHSEED``), read by torch, numpy's BLAS and
  the interpreter as they load, so it imports them single-threaded and forks no running thread;
  the nannies use it only while their pre-spawn environment is the one it started with, and
  otherwise spawn;
* nothing in it initialises CUDA (importing torch does not);
* only a forkserver this module started is used (one started by other code may have another
  environment or imports), and it is stopped when the last embedded nanny closes, so a closed
  cluster leaves no process; it also exits with the learner (its ``multiprocessing`` pipe).

Only on Linux: on macOS, forking a process that has loaded Apple's frameworks (torch loads
Accelerate and Metal's libraries) is what ``spawn``, Python's default there, avoids, and Windows
has no forkserver. Elsewhere, or where the dask config key
``daskrl.embedded-cluster.forkserver`` is false, or ``distributed.worker.multiprocessing-method``
is set to anything but its default ``spawn``, the workers start as Dask starts them.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import threading
from typing import Any

from daskrl.deploy._worker_preload import WORKER_MODULES

__all__ = ["FORKSERVER_MODULES", "METHOD_KEY", "enabled", "pre_spawn_environ", "prestart",
           "running", "start", "stop_if_idle", "use_in_distributed"]

logger = logging.getLogger(__name__)

METHOD_KEY = "distributed.worker.multiprocessing-method"

FORKSERVER_MODULES = ("distributed", "distributed.nanny", *WORKER_MODULES)
"""What the forkserver imports before it forks any worker."""

_lock = threading.Lock()
_started_env: dict[str, str] | None = None  # the pre-spawn env of the forkserver we started


def _server() -> Any:
    """``multiprocessing``'s forkserver (private in every Python that has one), or None."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return None
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    needed = ("_forkserver_pid", "_stop", "ensure_running", "set_forkserver_preload")
    return server if all(hasattr(server, a) for a in needed) else None


def enabled() -> bool:
    """Whether the embedded cluster's workers may start from the forkserver here."""
    import dask

    if not sys.platform.startswith("linux"):
        return False
    if not dask.config.get("daskrl.embedded-cluster.forkserver", True):
        return False
    if dask.config.get(METHOD_KEY, "spawn") != "spawn":  # the user chose a method: theirs
        return False
    return _server() is not None


def pre_spawn_environ() -> dict[str, str]:
    """The environment a Dask nanny sets before it starts its worker process (as
    ``Nanny.__init__`` computes it: ``distributed.nanny.pre-spawn-environ``, a fixed
    ``PYTHONHASHSEED``)."""
    import dask

    config = dask.config.get("distributed.nanny.pre-spawn-environ", {}) or {}
    env = {k: os.environ.get(k, str(v)) for k, v in config.items() if v is not None}
    if env.get("PYTHONHASHSEED") in (None, "0"):
        env["PYTHONHASHSEED"] = "6640"
    return env


def running() -> int | None:
    """The pid of the forkserver this module started, while it runs."""
    server = _server()
    if _started_env is None or server is None:
        return None
    return getattr(server, "_forkserver_pid", None)


def start(env: dict[str, str]) -> bool:
    """Make sure a forkserver started by this module runs with the pre-spawn environment
    ``env``; False (spawn instead) where it cannot: no forkserver, one started by other code, or
    ours with another environment.

    ``env`` is in ``os.environ`` while the forkserver starts and put back after, so it inherits
    it (``multiprocessing`` passes no environment of its own).
    """
    global _started_env
    server = _server()
    if server is None:
        return False
    with _lock:
        if server._forkserver_pid is not None:  # already running: ours, as it was started?
            return _started_env is not None and _started_env == env
        server.set_forkserver_preload(list(FORKSERVER_MODULES))
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            server.ensure_running()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        _started_env = dict(env)
        logger.debug("started the embedded cluster's forkserver (pid %s)",
                     server._forkserver_pid)
        return True


def prestart() -> bool:
    """Start the forkserver now, before any nanny asks for it, so that its imports overlap
    what the caller does next (``daskrl collect``: start the scheduler, import torch); False
    where the workers will spawn. Call from the main thread before any other thread runs:
    it sets environment variables for a moment."""
    return enabled() and start(pre_spawn_environ())


def use_in_distributed() -> None:
    """Let Dask use the forkserver as started here: distributed's ``get_mp_context`` would
    otherwise set its own preload list once, importing numpy, pandas and more in this process
    first."""
    import distributed.utils

    distributed.utils._forkserver_preload_set = True


def stop_if_idle() -> bool:
    """Stop the forkserver this module started, unless a process started from it runs; True
    if it was stopped."""
    global _started_env
    server = _server()
    with _lock:
        if server is None or _started_env is None or server._forkserver_pid is None:
            _started_env = None
            return False
        from multiprocessing import popen_forkserver

        for child in multiprocessing.active_children():  # also reaps the ended ones
            if isinstance(getattr(child, "_popen", None), popen_forkserver.Popen):
                return False
        pid = server._forkserver_pid
        server._stop()
        _started_env = None
        logger.debug("stopped the embedded cluster's forkserver (pid %s)", pid)
        return True
