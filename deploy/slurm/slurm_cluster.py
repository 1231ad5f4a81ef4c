"""A dask-jobqueue ``SLURMCluster`` for daskrl, every setting in one place (no YAML).

Run on a login node (or in a small learner job); it submits one SLURM job per worker::

    python deploy/slurm/slurm_cluster.py --print-job-script      # check what would be submitted
    python deploy/slurm/slurm_cluster.py --workers 8 --store /fsx/$USER/runs/run-1

Every site setting has a default in ``Settings`` (marked EDIT), a command-line flag and an
environment variable (the flag wins), e.g. on a small CPU-only site::

    python deploy/slurm/slurm_cluster.py --partition debug --gpus 0 --cpus 1 --memory 2GiB \\
        --venv "$VIRTUAL_ENV" --workers 2 --store /shared/runs/try --frames 4096

``python deploy/slurm/slurm_cluster.py --help`` lists them all. ``deploy/slurm/jobqueue.yaml``
holds the same settings as dask config, for ``daskrl.deploy.connect("slurm",
jobqueue_config=...)`` and ``daskrl collect --cluster slurm``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import stat
import sys
from pathlib import Path
from typing import Any


@dataclasses.dataclass
class Settings:
    """The site's settings; each has a flag (``--walltime``) and a variable
    (``DASKRL_WALLTIME``)."""

    venv: str = "~/venvs/daskrl"      # EDIT: the learner's venv, on the shared filesystem
    partition: str = "gpu"            # EDIT
    account: str | None = None        # EDIT, if your site needs one
    gpus: int = 1                     # GPUs per worker job; 0: CPU-only jobs (DASKRL_DEVICE=cpu)
    cpus: int = 8                     # EDIT: CPUs per worker job (per GPU)
    memory: str = "32GiB"             # EDIT: memory per worker job (also the worker's limit)
    walltime: str = "04:00:00"
    lifetime: str = "225m"            # workers retire before the walltime (one unit: not 3h45m)
    lifetime_stagger: str = "5m"      # ... not all at once
    death_timeout: int = 120          # a worker whose scheduler is gone exits
    interface: str | None = None      # e.g. ib0 (Dask traffic of scheduler and workers)
    tls_dir: str = "~/.daskrl-tls"    # shared with the compute nodes, mode 700; "none": no TLS
    log_directory: str | None = None  # job logs (default: the directory you run this from)
    dashboard: str = ":8787"

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Settings:
        """The defaults, with any ``DASKRL_<NAME>`` variable set in ``environ`` applied."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            text = environ.get(f"DASKRL_{f.name.upper()}")
            if text is not None:
                values[f.name] = int(text) if f.type in ("int", int) else text
        return cls(**values)


def slurm_cluster(settings: Settings | None = None, **overrides: Any) -> Any:
    """The ``SLURMCluster`` (its scheduler runs in this process); ``overrides`` (SLURMCluster
    arguments) win over ``settings``."""
    from dask_jobqueue import SLURMCluster

    s = settings or Settings.from_env()
    tls = s.tls_dir.lower() not in ("", "none")
    options: dict[str, Any] = {
        "job_name": "daskrl-worker",
        "cores": 1,                   # one Dask thread: a worker runs one batch at a time
        "processes": 1,               # one worker per job ...
        "job_cpu": s.cpus,            # ... whose envs and torch use the job's CPUs
        "memory": s.memory,
        "job_extra_directives": [f"--gres=gpu:{s.gpus}"] if s.gpus else [],  # ... and a GPU
        "queue": s.partition,
        "account": s.account,
        "walltime": s.walltime,
        "worker_extra_args": ["--lifetime", s.lifetime, "--lifetime-stagger", s.lifetime_stagger,
                              # a job killed whole leaves no semaphore files in /dev/shm
                              "--preload-nanny", "daskrl.deploy.nanny_preload"],
        "death_timeout": s.death_timeout,
        "interface": s.interface,
        "job_script_prologue": [
            f"source {s.venv}/bin/activate",  # same versions as the learner (daskrl checks)
            # With a GPU: SLURM's CUDA_VISIBLE_DEVICES is this job's GPU.
            f"export DASKRL_DEVICE={'cuda' if s.gpus else 'cpu'}",
        ],
        "local_directory": "${TMPDIR:-/tmp}",  # node-local scratch; the store is on /fsx
        "log_directory": s.log_directory,
        "security": tls,                        # TLS with fresh certificates ...
        "shared_temp_directory": s.tls_dir if tls else None,  # ... whose worker copies go here
        "scheduler_options": {"dashboard_address": s.dashboard},
    }
    options.update(overrides)
    if options.get("security") and options.get("shared_temp_directory"):
        _private_directory(options["shared_temp_directory"])
    return SLURMCluster(**options)


def _private_directory(path: str) -> None:
    """Create the TLS key directory (mode 700); refuse one that others can read."""
    expanded = Path(os.path.expandvars(os.path.expanduser(path)))
    expanded.mkdir(mode=0o700, parents=True, exist_ok=True)
    if stat.S_IMODE(expanded.stat().st_mode) & 0o077:
        sys.exit(f"{expanded} holds the workers' TLS keys but others can read it: "
                 f"chmod 700 {expanded}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = Settings.from_env()
    site = p.add_argument_group("site settings (default: $DASKRL_<NAME>, else the EDIT value)")
    for f in dataclasses.fields(Settings):
        site.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name,
                          default=getattr(defaults, f.name),
                          type=int if f.type in ("int", int) else str,
                          help=f"(DASKRL_{f.name.upper()}, default {getattr(defaults, f.name)!r})")
    p.add_argument("--print-job-script", action="store_true")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--store", default=f"/fsx/{os.environ.get('USER', 'me')}/runs/run-1")
    p.add_argument("--frames", type=int, default=1_000_000)
    p.add_argument("--frames-per-batch", type=int, default=4096)
    p.add_argument("--envs-per-worker", type=int, default=8)
    p.add_argument("--queue-timeout", type=float, default=3600,
                   help="seconds to wait for the first worker (jobs queue first)")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    settings = Settings(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Settings)})
    # SIGTERM (scancel of a learner job, kill) unwinds like Ctrl-C: the worker jobs are
    # cancelled and the TLS key files deleted on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    from distributed import Client

    import daskrl
    from daskrl.deploy import remove_worker_keys, wait_for_slurm_workers

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from learner import train  # deploy/learner.py

    cluster = slurm_cluster(settings)
    # Importing dask-jobqueue made Ctrl-C a silent sys.exit(0): make it KeyboardInterrupt again.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with cluster:
            if args.print_job_script:
                print(cluster.job_script())
                return
            cluster.adapt(minimum=args.workers, maximum=args.workers)  # replaces retirees
            with Client(cluster) as client:
                # Jobs wait in the queue first; a job that ends without its worker stops this.
                wait_for_slurm_workers(client, cluster, 1, timeout=args.queue_timeout)
                train(client, args.store, args.frames, args.frames_per_batch,
                      args.envs_per_worker)
    finally:
        remove_worker_keys(cluster)
    print(f"done: {daskrl.open_store(args.store).frames} frames in {args.store}")


if __name__ == "__main__":
    main()
