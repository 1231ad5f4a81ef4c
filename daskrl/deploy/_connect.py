"""Get a ``distributed.Client`` for where collection runs: this machine, any cluster, SLURM.

One call, so that a learner script reads the same everywhere and only its target changes::

    with daskrl.deploy.connect("local") as deployment:                    # this machine
    with daskrl.deploy.connect("tls://head:8786", security=sec) as d:      # any Dask cluster
    with daskrl.deploy.connect(scheduler_file="/fsx/sched.json") as d:     # sbatch-started
    with daskrl.deploy.connect("slurm", workers=8,
                               jobqueue_config="deploy/slurm/jobqueue.yaml") as d:  # jobqueue

:func:`connect` decides the target and returns a :class:`Deployment`, which closes what it
started (an embedded or SLURM cluster) and never a cluster it only connected to.  Starting is
left to :mod:`daskrl.deploy._cluster` (the embedded cluster) and :mod:`daskrl.deploy._slurm`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from pathlib import Path
from typing import Any

from distributed import Client, Security

from daskrl.deploy._cluster import local_cluster
from daskrl.deploy._slurm import close_cluster, start_slurm, wait_for_slurm_workers
from daskrl.errors import ClusterError, ConfigError

__all__ = ["Deployment", "connect", "tls_security"]

@dataclasses.dataclass
class Deployment:
    """A connected client, and the cluster daskrl started for it (``None`` when it only
    connected to a running one).  Use it as a context manager, or call :meth:`close`."""

    client: Client
    """The ``distributed.Client`` to pass as ``Collector(client=...)``."""
    cluster: Any = None
    """The cluster object daskrl started (``LocalCluster``, ``SLURMCluster``), closed with this."""

    def close(self) -> None:
        """Close the client, then the cluster daskrl started (a running one is left alone):
        a SLURM cluster cancels its jobs and deletes the TLS key files it wrote for them."""
        self.client.close()
        if self.cluster is not None:
            close_cluster(self.cluster)

    def wait_for_workers(self, n: int = 1, timeout: float = 3600.0) -> None:
        """Wait until ``n`` workers have joined, for at most ``timeout`` seconds.

        On a SLURM cluster daskrl started, this gives up early with
        :class:`~daskrl.errors.SlurmJobError` (the job's state and the end of its log) when a
        worker job ends before its worker joined, instead of waiting out ``timeout``.
        """
        if self.cluster is not None and hasattr(self.cluster, "job_script"):
            wait_for_slurm_workers(self.client, self.cluster, n, timeout)
        else:
            self.client.wait_for_workers(n, timeout=timeout)

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def tls_security(ca_file: str, cert: str, key: str | None = None) -> Security:
    """A client ``Security`` for a cluster started with ``--tls-ca-file/--tls-cert/--tls-key``.

    ``cert`` may hold the key too (then leave ``key`` out).  Encryption is required.
    """
    for what, path in (("CA file", ca_file), ("certificate", cert), ("key", key)):
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"TLS {what} {path!r} does not exist or is not a file.")
    return Security(tls_ca_file=ca_file, tls_client_cert=cert, tls_client_key=key,
                    require_encryption=True)


def connect(
    cluster: str = "local",
    *,
    scheduler_file: str | os.PathLike[str] | None = None,
    workers: int | None = None,
    security: Security | bool | None = None,
    jobqueue_config: str | os.PathLike[str] | None = None,
    timeout: float = 60.0,
    **cluster_options: Any,
) -> Deployment:
    """Connect a client to where collection runs.

    Parameters
    ----------
    cluster
        ``"local"``: start the embedded ``LocalCluster`` (:func:`daskrl.deploy.local_cluster`).
        ``"slurm"``: start a dask-jobqueue ``SLURMCluster`` (needs ``daskrl[slurm]``).
        Otherwise the address of a running scheduler, e.g. ``"tcp://head:8786"``,
        ``"tls://head:8786"``.  Ignored when ``scheduler_file`` is given.
    scheduler_file
        The JSON file a scheduler wrote with ``dask scheduler --scheduler-file``.
    workers
        ``"local"``: how many worker processes (default one per core); ``"slurm"``: how many
        workers to keep (``cluster.adapt(minimum=workers, maximum=workers)``, so that workers
        that retire before the walltime are replaced; default none: scale it yourself).
        Not valid with a running cluster.
    security
        A ``distributed.Security`` (see :func:`tls_security`), or ``True`` for TLS with
        temporary certificates on a cluster daskrl starts.  ``"slurm"`` defaults to ``True``.
    jobqueue_config
        ``"slurm"``: a dask config YAML (like ``deploy/slurm/jobqueue.yaml``) applied while the
        cluster is built; without it, dask's own config (``~/.config/dask/``) is used.
    timeout
        Seconds to wait for a running scheduler to answer.
    cluster_options
        Passed to ``LocalCluster`` or ``SLURMCluster`` (e.g. ``queue=``, ``account=``).
    """
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 0):
        raise ConfigError(f"workers must be a non-negative integer or None, got {workers!r}.")
    if scheduler_file is not None or cluster not in ("local", "slurm"):
        if workers is not None or cluster_options or security is True:
            raise ConfigError(
                "workers=, security=True and cluster options size or configure a cluster "
                "daskrl starts ('local' or 'slurm'); a running cluster is sized by whoever "
                f"started it. Got workers={workers!r}, options={sorted(cluster_options)}."
            )
        return Deployment(_connect_running(cluster, scheduler_file, security, timeout))
    if cluster == "local":
        return _start_local(workers, security, cluster_options)
    slurm = start_slurm(workers, True if security is None else security, jobqueue_config,
                        cluster_options)
    return _deployment_of(slurm)


def _start_local(workers: int | None, security: Security | bool | None,
                 options: dict[str, Any]) -> Deployment:
    """The embedded cluster: ``security`` True/False turns its temporary-credential TLS on or
    off (None: the dask config's default), a ``Security`` is used as it is."""
    if isinstance(security, Security):
        options["security"] = security
        tls = None
    else:
        tls = security
    return _deployment_of(local_cluster(workers or None, tls=tls, **options))


def _deployment_of(cluster: Any) -> Deployment:
    """A client of the cluster daskrl just started (with the cluster's own credentials); the
    cluster is closed again when the client cannot connect."""
    try:
        return Deployment(Client(cluster, set_as_default=False), cluster)
    except BaseException:
        close_cluster(cluster)
        raise


def _connect_running(address: str, scheduler_file: Any, security: Any, timeout: float) -> Client:
    if scheduler_file is not None:
        path = Path(scheduler_file)
        if not path.is_file():
            raise ConfigError(
                f"scheduler file {str(path)!r} does not exist. Start the scheduler with "
                "`dask scheduler --scheduler-file PATH` on a filesystem this machine sees, and "
                "wait until it has written the file."
            )
        try:
            address = str(json.loads(path.read_text())["address"])
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(
                f"scheduler file {str(path)!r} holds no scheduler address (got {e!r}); is it "
                "still being written, or is it another kind of file?"
            ) from e
        target: dict[str, Any] = {"scheduler_file": str(path)}
        where = f"the scheduler in {str(path)!r}"
    else:
        target = {"address": address}
        where = "the scheduler"
    if security is None and address.startswith("tls://"):
        security = _security_from_config()
        if security is None:
            raise ConfigError(
                f"{where} uses TLS ({address}) but no certificates were given: pass "
                "security=daskrl.deploy.tls_security(ca_file, cert, key) (CLI: --tls-ca-file, "
                "--tls-cert, --tls-key) or set distributed.comm.tls.* in the dask config."
            )
    _check_listening(address, where, timeout)
    try:
        return Client(**target, security=security, timeout=timeout, set_as_default=False)
    except (OSError, TimeoutError) as e:
        hint = ("" if security is not None else
                " If the cluster uses TLS, pass security=tls_security(ca, cert, key) "
                "(CLI: --tls-ca-file/--tls-cert/--tls-key).")
        raise ClusterError(
            f"could not connect to {where} at {address}: {type(e).__name__}: {e}."
            f"{hint}"
        ) from e


def _check_listening(address: str, where: str, timeout: float) -> None:
    """Fail fast, with the address in the message, when nothing accepts connections there."""
    from distributed.comm import parse_address, parse_host_port

    try:
        protocol, loc = parse_address(address)
    except ValueError as e:
        raise ConfigError(f"{address!r} is not a Dask scheduler address: {e}") from e
    if protocol not in ("tcp", "tls"):  # inproc://, ucx://...: let distributed connect
        from distributed.comm.registry import get_backend

        try:
            get_backend(protocol)
        except ValueError as e:
            raise ConfigError(f"{address!r} is not a Dask scheduler address: {e}") from e
        return
    host, port = parse_host_port(loc, default_port=8786)
    try:
        socket.create_connection((host, port), timeout=min(timeout, 10.0)).close()
    except OSError as e:
        raise ClusterError(
            f"nothing accepts connections at {address} ({where}): {e}. Check that the "
            "scheduler runs, its host and port, and that no firewall is in between."
        ) from e


def _security_from_config() -> Security | None:
    """TLS settings from dask config (``distributed.comm.tls.*``), if any are set."""
    sec = Security()
    return sec if sec.get_tls_config_for_role("client").get("ca_file") else None
