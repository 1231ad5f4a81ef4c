"""SLURM through dask-jobqueue: settings from a YAML recipe, a private directory for the
workers' TLS keys, a check of the job script before anything is queued, and a wait for workers
that gives up, with the job's state and the end of its log, as soon as a job ends without its
worker ever joining.

Job state comes from ``squeue`` and ``scontrol`` (no accounting database needed): SLURM keeps
an ended job there for ``MinJobAge`` seconds (300 by default).
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shlex
import signal
import stat
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dask

from daskrl.errors import ConfigError, MissingDependencyError, SlurmError, SlurmJobError

logger = logging.getLogger(__name__)

SLURM_EXTRA = 'pip install "daskrl[slurm]"'
ACTIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "RESIZING", "REQUEUED",
                 "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD", "SIGNALING", "STAGE_OUT",
                 "SUSPENDED", "STOPPED"}
"""Job states in which a job may still start its worker; every other state has ended."""
LOG_LINES = 20
COMMAND_TIMEOUT_S = 60.0


def slurm_options(path: Path) -> dict[str, Any]:
    """``SLURMCluster`` keyword arguments from the ``jobqueue.slurm`` section of a dask config
    file (dask-jobqueue reads its config anew for every job, so a temporary
    ``dask.config.set`` would not last; explicit arguments do)."""
    import yaml

    if not path.is_file():
        raise ConfigError(f"jobqueue_config {str(path)!r} does not exist.")
    data = yaml.safe_load(path.read_text()) or {}
    section = data.get("jobqueue", {}).get("slurm") if isinstance(data, Mapping) else None
    if not isinstance(section, Mapping):
        raise ConfigError(
            f"jobqueue_config {str(path)!r} has no 'jobqueue: slurm:' section; see "
            "deploy/slurm/jobqueue.yaml for the layout."
        )
    return {option_name(k): v for k, v in section.items() if v is not None}


def option_name(key: str) -> str:
    """The ``SLURMCluster`` argument for a ``jobqueue.slurm`` config key (``job-cpu`` ->
    ``job_cpu``, ``name`` -> ``job_name``)."""
    return {"name": "job_name"}.get(key, key.replace("-", "_"))


def _import_slurm_cluster() -> Any:
    """``dask_jobqueue.SLURMCluster``, with the program's SIGINT handler kept: importing
    dask-jobqueue (its ``runner`` module) replaces it with a silent ``sys.exit()``, so that
    Ctrl-C would end a learner with status 0 and no KeyboardInterrupt."""
    in_main_thread = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGINT) if in_main_thread else None
    from dask_jobqueue import SLURMCluster

    if in_main_thread and before is not None and signal.getsignal(signal.SIGINT) is not before:
        signal.signal(signal.SIGINT, before)
    return SLURMCluster


def start_slurm(workers: int | None, security: Any, jobqueue_config: Any,
                options: dict[str, Any]) -> Any:
    """A ``SLURMCluster`` from ``jobqueue_config`` and ``options`` (which win); with
    ``workers``, its job script is checked by ``sbatch --test-only`` and it adapts to that
    many workers."""
    try:
        SLURMCluster = _import_slurm_cluster()
    except ImportError as e:
        raise MissingDependencyError(
            f"cluster='slurm' needs dask-jobqueue, which is not installed: {SLURM_EXTRA}"
        ) from e
    if jobqueue_config is not None:
        options = {**slurm_options(Path(jobqueue_config)), **options}
    if security is not False:
        shared = options.get("shared_temp_directory") or dask.config.get(
            "jobqueue.slurm.shared-temp-directory", None)
        options["shared_temp_directory"] = private_directory(shared)
    slurm = SLURMCluster(security=security or None, **options)
    atexit.register(_remove_keys_at_exit, weakref.ref(slurm))
    try:
        if workers:
            check_job_script(slurm)
            # Adaptive with a fixed size: a worker that retires at its --lifetime (before the
            # walltime) is replaced by a new job.
            slurm.adapt(minimum=workers, maximum=workers)
        return slurm
    except BaseException:
        close_cluster(slurm)
        raise


def close_cluster(cluster: Any) -> None:
    """Close a cluster (a jobqueue cluster cancels its jobs) and delete its TLS key files."""
    try:
        cluster.close()
    finally:
        remove_worker_keys(cluster)


def remove_worker_keys(cluster: Any) -> None:
    """Delete the TLS key files dask-jobqueue wrote to ``shared_temp_directory`` for the jobs.

    dask-jobqueue deletes them only when the cluster object is garbage-collected (they are
    ``NamedTemporaryFile`` objects held by it); a closed cluster needs them no more.
    """
    for value in list(vars(cluster).values()):
        name = getattr(value, "name", None)
        if (isinstance(name, str) and os.path.basename(name).startswith(".dask-jobqueue.worker.")
                and callable(getattr(value, "close", None))):
            value.close()


def _remove_keys_at_exit(ref: weakref.ref[Any]) -> None:
    cluster = ref()
    if cluster is not None:
        remove_worker_keys(cluster)


def private_directory(path: str | None) -> str:
    """The directory where SLURM TLS keys go: shared with the compute nodes, private to you."""
    if not path:
        raise ConfigError(
            "TLS on SLURM (the default) writes the workers' keys to a directory the compute "
            "nodes can read: set jobqueue.slurm.shared-temp-directory (in jobqueue.yaml) or "
            "pass shared_temp_directory=, e.g. '~/.daskrl-tls' on your shared home, mode 700."
        )
    expanded = Path(os.path.expandvars(os.path.expanduser(path)))
    expanded.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = stat.S_IMODE(expanded.stat().st_mode)
    if mode & 0o077:
        raise ConfigError(
            f"shared_temp_directory {str(expanded)!r} has mode {mode:o}; the cluster's keys go "
            "there and whoever reads them can run code on your workers. Run "
            f"`chmod 700 {expanded}` (or pick a private directory)."
        )
    return path


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except FileNotFoundError as e:
        raise SlurmError(f"{args[0]!r} is not installed here; the SLURM client commands "
                          "(sbatch, squeue, scontrol, scancel) must be on PATH.") from e
    except subprocess.TimeoutExpired as e:
        raise SlurmError(f"`{shlex.join(args)}` did not answer within {COMMAND_TIMEOUT_S:.0f}s: "
                          "is slurmctld reachable from this machine?") from e


def check_job_script(cluster: Any) -> None:
    """``sbatch --test-only`` the cluster's job script: a partition, GPU, CPU or memory request
    this SLURM cannot satisfy fails here, with sbatch's own message, before any job queues."""
    script = cluster.job_script()
    submit = shlex.split(cluster.job_cls.submit_command)
    with tempfile.NamedTemporaryFile("w", suffix=".sh", prefix="daskrl-job-") as f:
        f.write(script)
        f.flush()
        out = _run([*submit, "--test-only", f.name])
    if out.returncode:
        directives = "\n".join(ln for ln in script.splitlines() if ln.startswith("#SBATCH"))
        raise SlurmJobError(
            f"SLURM refuses the worker job: {out.stderr.strip() or out.stdout.strip()}\n"
            f"Its directives:\n{directives}\nChange the setting it names (queue, job-cpu, "
            "memory, job-extra-directives; see docs/deploy/slurm.md, 'A small site')."
        )


def job_states(job_ids: list[str]) -> dict[str, str]:
    """``{job id: state}`` from ``squeue``; a job SLURM no longer knows is ``"UNKNOWN"``."""
    if not job_ids:
        return {}
    out = _run(["squeue", "--noheader", "--states=all", f"--jobs={','.join(job_ids)}",
                "--format=%i %T"])
    states = dict.fromkeys(job_ids, "UNKNOWN")
    if out.returncode and "Invalid job id" not in out.stderr:
        raise SlurmError(f"squeue failed ({out.returncode}): {out.stderr.strip()}")
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in states:
            states[parts[0]] = parts[1]
    return states


def job_details(job_id: str) -> dict[str, str]:
    """``scontrol show job`` fields of one job (empty when SLURM no longer knows it)."""
    out = _run(["scontrol", "show", "job", "--oneliner", job_id])
    if out.returncode:
        return {}
    return dict(re.findall(r"(\S+?)=(\S*)", out.stdout))


def _log_path(pattern: str, job: Mapping[str, str]) -> str:
    """A job's --output/--error path with SLURM's %-patterns filled in (scontrol of older SLURM
    shows them as given, e.g. ``daskrl-worker-%J.err``)."""
    values = {"j": job.get("JobId", ""), "J": job.get("JobId", ""), "x": job.get("JobName", ""),
              "u": job.get("UserId", "").split("(")[0], "N": job.get("BatchHost", ""),
              "A": job.get("ArrayJobId", job.get("JobId", "")), "a": job.get("ArrayTaskId", ""),
              "%": "%"}
    return re.sub(r"%(\d*)([jJxuNAa%])",
                  lambda m: values[m.group(2)].zfill(int(m.group(1) or 0)), pattern)


ERROR_LINE = re.compile(r"^\s*(?:[\w.]+\.)?\w*(?:Error|Exception)\b: .+")


def _tail(path: str, lines: int = LOG_LINES) -> str:
    """The exceptions named in a log's end (a chained traceback names its cause first, out of
    sight of the last lines), then its last ``lines`` lines."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError as e:
        return f"    (cannot read it here: {e.strerror}; look on the node that ran the job)"
    errors = list(dict.fromkeys(ln.strip() for ln in text.splitlines() if ERROR_LINE.match(ln)))
    last = "\n".join("    " + ln for ln in text.splitlines()[-lines:]) or "    (empty)"
    if not errors:
        return last
    return ("  errors in it:\n" + "\n".join("    " + e for e in errors[-5:])
            + f"\n  its last lines:\n{last}")


def describe_ended_job(job_id: str, state: str) -> str:
    """A job's end, in words: state, exit code, reason, and the last lines of its logs."""
    d = job_details(job_id)
    if not d:
        return (f"SLURM job {job_id} ended ({state}) and SLURM no longer knows it: its log is "
                "where the job's --output/--error (or log-directory) put it.")
    text = (f"SLURM job {job_id} ({d.get('JobName', '?')}) ended {d.get('JobState', state)} "
            f"(exit code {d.get('ExitCode', '?')}, reason {d.get('Reason', '?')}) on "
            f"{d.get('NodeList', '?')}")
    logs = [_log_path(p, d) for p in dict.fromkeys((d.get("StdErr"), d.get("StdOut"))) if p]
    for path in logs:
        text += f"\nthe last lines of {path}:\n{_tail(path)}"
    return text


def wait_for_slurm_workers(client: Any, cluster: Any, n: int = 1, timeout: float = 3600.0,
                           poll: float = 2.0) -> None:
    """Wait until ``n`` workers have joined ``client``'s scheduler, for at most ``timeout``
    seconds (jobs wait in the queue first).

    Raises :class:`~daskrl.errors.SlurmJobError` as soon as one of ``cluster``'s jobs has
    ended before ``n`` workers joined (its worker crashed at start, or SLURM failed it), with
    the job's state, exit code and the end of its log; or at ``timeout``, with the jobs'
    states (e.g. still PENDING).
    """
    deadline = time.monotonic() + timeout
    while True:
        joined = len(client.nthreads())
        if joined >= n:
            return
        jobs = sorted({job.job_id for job in list(cluster.workers.values())
                       if getattr(job, "job_id", None)}, key=int)
        states = job_states(jobs)
        ended = [j for j in jobs if states[j] not in ACTIVE_STATES]
        if ended:
            reports = "\n".join(describe_ended_job(j, states[j]) for j in ended[:3])
            raise SlurmJobError(
                f"{len(ended)} of {len(jobs)} SLURM worker jobs ended before {n} Dask "
                f"worker(s) joined (joined: {joined}); daskrl gives up instead of waiting for "
                f"workers that will not come.\n{reports}"
            )
        if time.monotonic() > deadline:
            pending = ", ".join(f"{j} {s}" for j, s in states.items()) or "none submitted"
            raise SlurmJobError(
                f"{joined} of {n} Dask worker(s) joined within {timeout:.0f}s; the worker jobs: "
                f"{pending}. `squeue --jobs=...` tells why a job still waits (Reason)."
            )
        time.sleep(poll)
