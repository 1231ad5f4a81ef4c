"""A dask-jobqueue ``SLURMCluster`` for daskrl, every setting in one place (no YAML).

Run on a login node (or in a small learner job); it submits one SLURM job per GPU worker::

    python deploy/slurm/slurm_cluster.py --print-job-script      # check what would be submitted
    python deploy/slurm/slurm_cluster.py --workers 8 --store /fsx/$USER/runs/run-1

``deploy/slurm/jobqueue.yaml`` holds the same settings as dask config, for
``daskrl.deploy.connect("slurm", jobqueue_config=...)`` and ``daskrl collect --cluster slurm``.
Edit the constants marked EDIT.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

VENV = "~/venvs/daskrl"               # EDIT: the learner's venv, on the shared filesystem
PARTITION = "gpu"                     # EDIT
ACCOUNT: str | None = None            # EDIT, if your site needs one
CPUS_PER_GPU = 8                      # EDIT
MEMORY_PER_GPU = "32GiB"              # EDIT
WALLTIME = "04:00:00"
LIFETIME, STAGGER = "3h45m", "5m"     # workers retire before the walltime, not all at once
TLS_DIR = "~/.daskrl-tls"             # shared with the compute nodes, mode 700


def slurm_cluster(**overrides: Any) -> Any:
    """The ``SLURMCluster`` (its scheduler runs in this process); ``overrides`` win."""
    from dask_jobqueue import SLURMCluster

    tls_dir = Path(os.path.expanduser(TLS_DIR))
    tls_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    options: dict[str, Any] = {
        "job_name": "daskrl-worker",
        "cores": 1,                   # one Dask thread: a worker runs one batch at a time
        "processes": 1,               # one worker per job ...
        "job_cpu": CPUS_PER_GPU,      # ... whose envs and torch use the job's CPUs
        "memory": MEMORY_PER_GPU,
        "job_extra_directives": ["--gres=gpu:1"],   # ... and one GPU
        "queue": PARTITION,
        "account": ACCOUNT,
        "walltime": WALLTIME,
        "worker_extra_args": ["--lifetime", LIFETIME, "--lifetime-stagger", STAGGER],
        "death_timeout": 120,
        "job_script_prologue": [
            f"source {VENV}/bin/activate",   # same versions as the learner (daskrl checks)
            "export DASKRL_DEVICE=cuda",     # SLURM's CUDA_VISIBLE_DEVICES: this job's GPU
        ],
        "local_directory": "${TMPDIR:-/tmp}",  # node-local scratch; the store is on /fsx
        "security": True,                       # TLS with fresh certificates ...
        "shared_temp_directory": TLS_DIR,       # ... whose worker copies go here
        "scheduler_options": {"dashboard_address": ":8787"},
    }
    options.update(overrides)
    return SLURMCluster(**options)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--print-job-script", action="store_true")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--store", default=f"/fsx/{os.environ.get('USER', 'me')}/runs/run-1")
    p.add_argument("--frames", type=int, default=1_000_000)
    args = p.parse_args()

    import sys

    from distributed import Client

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from learner import train  # deploy/learner.py

    with slurm_cluster() as cluster:
        if args.print_job_script:
            print(cluster.job_script())
            return
        cluster.adapt(minimum=args.workers, maximum=args.workers)  # replaces retired workers
        with Client(cluster) as client:
            client.wait_for_workers(1, timeout=3600)  # jobs wait in the queue first
            train(client, args.store, args.frames)


if __name__ == "__main__":
    main()
