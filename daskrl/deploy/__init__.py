"""Where the workers come from: the embedded cluster, any running Dask cluster, SLURM.

``_connect`` decides the target and returns a :class:`Deployment`; ``_cluster`` starts the
embedded ``LocalCluster``; ``_slurm`` starts and watches SLURM jobs; ``_worker_report`` says
what each worker would collect on; ``_package_versions`` checks the learner's packages against
the workers'.
"""

from __future__ import annotations

from daskrl.deploy._cluster import ParentNanny, local_cluster
from daskrl.deploy._connect import Deployment, connect, tls_security
from daskrl.deploy._package_versions import check_versions
from daskrl.deploy._slurm import remove_worker_keys, wait_for_slurm_workers
from daskrl.deploy._worker_report import worker_report

__all__ = ["Deployment", "ParentNanny", "check_versions", "connect", "local_cluster", "remove_worker_keys", "tls_security",
           "wait_for_slurm_workers", "worker_report"]
