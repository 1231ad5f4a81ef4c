"""Where the workers come from: the embedded cluster, any running Dask cluster, SLURM."""

from __future__ import annotations

from daskrl.deploy._cluster import local_cluster
from daskrl.deploy._connect import (
    Deployment,
    connect,
    remove_worker_keys,
    tls_security,
    wait_for_slurm_workers,
    worker_report,
)

__all__ = ["Deployment", "connect", "local_cluster", "remove_worker_keys", "tls_security",
           "wait_for_slurm_workers", "worker_report"]
