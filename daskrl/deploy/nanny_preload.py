"""Dask nanny preload for workers started by ``dask worker``: their queues hold no semaphore
names once the worker process is up, so a job killed whole leaves no ``/dev/shm`` files.

Each time a nanny starts its worker process it makes two ``multiprocessing`` queues, six named
POSIX semaphores: files ``/dev/shm/sem.mp-*``. When a batch system ends a job by killing all
its processes at once (``SIGKILL`` after SLURM's ``KillWait``, the OOM killer, a node's
cgroup torn down), the nanny and the ``multiprocessing`` resource tracker die together and
the six files stay on the node for good, one set per worker start. This preload does for a
``dask worker`` what the embedded cluster's nannies do (:mod:`daskrl.deploy._nanny`): once the
worker process has opened the semaphores, it unlinks their names. Both processes keep using
them.

Use it where workers start from the command line (the SLURM recipes do)::

    dask worker tls://scheduler:8786 --preload-nanny daskrl.deploy.nanny_preload ...
"""

from __future__ import annotations

import functools
from typing import Any

from daskrl.deploy._nanny import release_worker_queue_names

__all__ = ["dask_setup"]


def dask_setup(nanny: Any) -> None:
    """Dask preload hook (run by the nanny before it starts its worker process): after every
    start of the worker process, restarts included, unlink its queues' semaphore names."""
    from distributed import Nanny

    if not isinstance(nanny, Nanny):
        raise TypeError(f"{__name__} is a nanny preload, loaded here by a "
                        f"{type(nanny).__name__}: pass it with --preload-nanny, not --preload")
    instantiate = nanny.instantiate

    @functools.wraps(instantiate)
    async def instantiate_and_release() -> Any:
        status = await instantiate()
        release_worker_queue_names(nanny)
        return status

    nanny.instantiate = instantiate_and_release  # type: ignore[method-assign]  # this nanny only
