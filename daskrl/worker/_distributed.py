"""The one module of daskrl that reads a Dask worker's internals.

Everything else on the worker side uses distributed's public API (``get_worker``,
``get_client``, ``Worker.plugins``, ``Worker.data``).  Whether the running task was cancelled
has no public API: :func:`running_task_cancelled` reads the worker's state machine
(``Worker.state.tasks``), and answers "not cancelled" where those internals change.
"""

from __future__ import annotations

from distributed import Worker, get_worker

__all__ = ["local_data", "running_task_cancelled", "this_worker"]


def this_worker() -> Worker:
    """The worker running the calling task."""
    return get_worker()


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
