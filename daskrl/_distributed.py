"""The one module of daskrl that reads a Dask worker's internals.

Everything else on the worker side uses distributed's public API (``get_worker``,
``get_client``, ``Worker.plugins``, ``Worker.data``).  Whether the running task was cancelled
has no public API: :func:`running_task_cancelled` reads the worker's state machine
(``Worker.state.tasks``), and answers "not cancelled" where those internals change.
"""

from __future__ import annotations

import time
from contextlib import suppress

from distributed import Client, Worker, default_client, get_client, get_worker

__all__ = ["local_data", "running_task_cancelled", "this_worker", "worker_client"]

CLIENT_TRIES = 3
"""How often :func:`worker_client` tries to register the worker's client."""


def this_worker() -> Worker:
    """The worker running the calling task."""
    return get_worker()


def worker_client() -> Client:
    """The calling worker's client, made on first use.

    Registering it can fail when the scheduler broadcasts to every client (a worker holding
    scattered data just died) in the same instant: the client then reads two messages where
    it expects its ``stream-start``, and asserts, left as the default client. Such a client
    is closed and made again.
    """
    for _ in range(CLIENT_TRIES - 1):
        try:
            return get_client()
        except AssertionError:
            with suppress(ValueError):  # no default client
                broken = default_client()
                if broken.status != "running":
                    broken.close(timeout=1)
            time.sleep(0.1)
    return get_client()


def local_data(worker: Worker, key: str) -> object | None:
    """The value this worker holds under ``key``, or None (not here, or spilled and
    unreadable)."""
    try:
        return worker.data.get(key)
    except Exception:  # spilled and unreadable, or a worker without this mapping
        return None


def running_task_cancelled(worker: Worker) -> bool:
    """True if the task running in this thread was cancelled (its result is not wanted)."""
    try:
        ts = worker.state.tasks.get(worker.get_current_task())
    except Exception:  # not inside a task, or worker internals changed: assume wanted
        return False
    return ts is not None and ts.state == "cancelled"
