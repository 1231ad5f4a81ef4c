"""Torch's threads on a worker: as many as the worker's own, whatever started it.

A Dask nanny starts its worker with ``OMP_NUM_THREADS=1``; a ``dask worker --no-nanny``, a
SLURM job's worker or a worker started from Python gets torch's default, one intra-op thread
per core, and several such workers on a host oversubscribe it (6x slower, measured: issue 28).
:func:`size_torch_threads` gives torch the worker's thread count instead, unless the user
chose a count: ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` in the worker's environment or in
the collector's ``env_vars``, or a ``torch.set_num_threads`` below the worker's count.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

import torch

__all__ = ["THREAD_VARS", "size_torch_threads"]

logger = logging.getLogger(__name__)

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""Environment variables by which a user chooses torch's thread count."""


def size_torch_threads(worker_threads: int, env_vars: Mapping[str, str],
                       where: str) -> int | None:
    """Set torch's intra-op threads for a worker of ``worker_threads`` threads; return the
    count set, or None where it was left alone.

    ``env_vars`` (the collector's, already applied to ``os.environ``) that name a count are
    applied to torch too: torch reads the variables once, when it starts, before the
    collector's arrive. A count in the worker's own environment is the user's: left alone.
    """
    for var in THREAD_VARS:
        chosen = env_vars.get(var)
        if chosen is not None:
            if chosen.strip().isdigit() and int(chosen) > 0:
                return _set(int(chosen), f"{var}={chosen} in env_vars", where)
            return None  # a form torch reads its own way (e.g. OpenMP's nested "4,2")
    if any(os.environ.get(var) for var in THREAD_VARS):
        return None  # the worker's environment chose (a nanny's OMP_NUM_THREADS=1 included)
    wanted = max(1, worker_threads)
    if torch.get_num_threads() <= wanted:
        return None  # torch's default on a small host, or the user's own smaller count
    return _set(wanted, f"the worker's {worker_threads} thread(s)", where)


def _set(threads: int, why: str, where: str) -> int:
    torch.set_num_threads(threads)
    logger.debug("%s: torch uses %d intra-op thread(s), as %s", where, threads, why)
    return threads
