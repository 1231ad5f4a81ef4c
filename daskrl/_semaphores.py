"""Named POSIX semaphores that a killed process would leave in ``/dev/shm``, unnamed early.

``multiprocessing`` locks and queues made in a ``spawn`` or ``forkserver`` context (every
lock of a process started that way: its default context is its parent's method) are named
semaphores, files ``/dev/shm/sem.mp-*``. Python unlinks them when they are collected or the
process exits, or, failing that, the resource tracker does when the last process that knows
it ends. A process killed together with its tracker (``SIGKILL`` to a process group, a batch
system ending a job, the OOM killer) leaves the files for good. A name is only needed until
every process that uses the semaphore has opened it; after that it can go, and the
semaphore keeps working for everyone who has it.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

__all__ = ["queue_locks", "release_semaphore_names"]

logger = logging.getLogger(__name__)


def queue_locks(*queues: Any) -> list[Any]:
    """The semaphores of ``multiprocessing`` queues (``None`` entries are skipped)."""
    return [getattr(q, attr, None) for q in queues if q is not None
            for attr in ("_rlock", "_wlock", "_sem")]  # multiprocessing.Queue's semaphores


def release_semaphore_names(*locks: Any) -> int:
    """Unlink the names of ``multiprocessing`` semaphores (locks) this process created, whose
    other users (if any) have opened them already; return how many names were unlinked.

    Best effort: anything that is not a named semaphore of this process is skipped, and the
    semaphores keep working; their finalizers and the resource tracker's record are dropped
    with the names, so that nothing unlinks them twice.
    """
    from multiprocessing import resource_tracker, util
    from multiprocessing.synchronize import SemLock

    try:
        sem_unlink = importlib.import_module("_multiprocessing").sem_unlink
    except (ImportError, AttributeError):  # a Python without named semaphores
        return 0
    cleanup = getattr(SemLock, "_cleanup", None)  # private, as below: 3.8 to 3.13 alike
    registry = getattr(util, "_finalizer_registry", None)
    if cleanup is None or registry is None:
        return 0
    names = {name for lock in locks if isinstance(lock, SemLock)
             and (name := getattr(getattr(lock, "_semlock", None), "name", None))}
    if not names:
        return 0
    # Only names this process will unlink itself (its finalizer): a semaphore it opened from
    # another process's name is that process's to unlink.
    finalizers = [f for f in list(registry.values())
                  if getattr(f, "_callback", None) is cleanup
                  and getattr(f, "_args", (None,))[0] in names]
    done = 0
    for f in finalizers:
        name = f._args[0]
        f.cancel()
        try:
            sem_unlink(name)
            done += 1
        except OSError:  # gone already
            logger.debug("semaphore %s was unlinked already", name)
        resource_tracker.unregister(name, "semaphore")
    return done
