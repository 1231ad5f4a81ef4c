"""The embedded cluster's nannies: worker processes that may start processes of their own
(:class:`ParentNanny`), and that leave no semaphore files behind (:class:`EmbeddedNanny`).

Each time a nanny starts its worker process it makes two ``multiprocessing`` queues in the
spawn context, three named POSIX semaphores each: the files ``/dev/shm/sem.mp-*``. Python
unlinks them when the queues are collected or the process exits, or, failing that, the
``multiprocessing`` resource tracker does when the last process that knows it ends. A learner
killed together with its tracker (``SIGKILL`` to its process group: ``kill -9 -PGID``, a batch
system or a container stopping the job, the OOM killer) leaves six files per worker start in
``/dev/shm`` for good.

A semaphore's name is only needed until every process that uses it has opened it: the worker
process opens its queues' semaphores as it starts, so once it is up, :class:`EmbeddedNanny`
unlinks the names (as the ``fork`` start method does at once). Both processes keep using the
semaphores; a kill at any later time leaves no file. Only the short window while a worker
starts remains.
"""

from __future__ import annotations

from typing import Any

import dask
from distributed import Nanny

from daskrl._semaphores import queue_locks, release_semaphore_names
from daskrl.deploy import _forkserver

__all__ = ["EmbeddedNanny", "ParentNanny", "release_worker_queue_names"]

DAEMON_KEY = "distributed.worker.daemon"
_DEFAULTS = {DAEMON_KEY: True, _forkserver.METHOD_KEY: "spawn"}  # distributed's own


class ParentNanny(Nanny):
    """A nanny whose worker process is not daemonic, so it may start processes of its own
    (gymnasium's ``AsyncVectorEnv``).

    Dask reads ``distributed.worker.daemon`` from the global dask config whenever a nanny
    starts its worker, restarts included; this nanny sets it false while any of its kind is
    starting one (they all run on the cluster's event loop) and puts the previous value back
    after. The worker is still ended with its nanny.
    """

    _starting = 0
    _saved: dict[str, Any] = {}

    def _start_config(self) -> dict[str, Any]:
        """The dask config keys set while this nanny starts its worker process."""
        return {DAEMON_KEY: False}

    async def instantiate(self) -> Any:
        cls = ParentNanny
        config = self._start_config()
        if cls._starting == 0:
            cls._saved = {}
        for key in config:
            cls._saved.setdefault(key, dask.config.get(key, _DEFAULTS.get(key)))
        dask.config.set(config)
        cls._starting += 1
        try:
            return await super().instantiate()
        finally:
            cls._starting -= 1
            if cls._starting == 0:
                dask.config.set(cls._saved)


class EmbeddedNanny(ParentNanny):
    """A :class:`ParentNanny` whose worker process starts from the embedded cluster's
    forkserver where it can (:mod:`daskrl.deploy._forkserver`), and whose worker processes'
    queues hold no semaphore names once started."""

    _open = 0  # embedded nannies not closed yet (the last one stops the forkserver)

    def _start_config(self) -> dict[str, Any]:
        config = super()._start_config()
        if _forkserver.enabled() and _forkserver.start(self.pre_spawn_env):
            _forkserver.use_in_distributed()
            config[_forkserver.METHOD_KEY] = "forkserver"
        return config

    async def start_unsafe(self) -> Any:
        if not getattr(self, "_counted", False):
            self._counted = True
            EmbeddedNanny._open += 1
        return await super().start_unsafe()

    async def instantiate(self) -> Any:
        status = await super().instantiate()
        release_worker_queue_names(self)
        return status

    async def close(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().close(*args, **kwargs)
        finally:
            if getattr(self, "_counted", False):
                self._counted = False
                EmbeddedNanny._open -= 1
                if EmbeddedNanny._open == 0:
                    _forkserver.stop_if_idle()


def release_worker_queue_names(nanny: Nanny) -> int:
    """Once ``nanny`` has started its worker process (which has opened them), unlink the names
    of the two queues' semaphores they share; return how many names were unlinked."""
    process = getattr(nanny, "process", None)
    if process is None:
        return 0
    return release_semaphore_names(*queue_locks(getattr(process, "init_result_q", None),
                                                getattr(process, "child_stop_q", None)))
