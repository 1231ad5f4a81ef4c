"""Where a command runs: the cluster flags shared by ``collect`` and ``info`` (``--scheduler``,
``--scheduler-file``, ``--cluster``, TLS, SLURM), and the :class:`~daskrl.deploy.Deployment`
they name."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from daskrl.deploy import Deployment, connect, tls_security
from daskrl.deploy._cluster import DASHBOARD_PORT
from daskrl.deploy._slurm import option_name
from daskrl.errors import ConfigError

__all__ = ["SLURM_QUEUE_WAIT_S", "add_cluster_args", "deployment", "print_dashboard_link"]

SLURM_QUEUE_WAIT_S = 3600
"""``--cluster slurm``: how long to wait for the first worker's job to start (a job that ends
before its worker joined stops the wait at once)."""


def _jobqueue_option(text: str) -> tuple[str, Any]:
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(
            f"--jobqueue-option takes KEY=VALUE (a jobqueue.slurm key of "
            f"deploy/slurm/jobqueue.yaml, e.g. queue=debug), got {text!r}")
    try:
        return option_name(key.strip()), yaml.safe_load(value)
    except yaml.YAMLError as e:
        raise argparse.ArgumentTypeError(f"--jobqueue-option {text!r}: the value is not "
                                         f"YAML: {e}") from e


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"--dashboard takes a port 0-65535 (0: any free "
                                         f"port), got {text!r}")
    return port


def add_cluster_args(p: argparse.ArgumentParser, *, dashboard: bool = False) -> None:
    """Add the flags that say which cluster a command runs on (``dashboard``: and
    ``--dashboard [PORT]`` for the embedded cluster's)."""
    g = p.add_argument_group("cluster (default: an embedded LocalCluster on this machine)")
    where = g.add_mutually_exclusive_group()
    where.add_argument("--scheduler", default=None, metavar="ADDRESS",
                       help="address of a running Dask scheduler, e.g. tcp://head:8786 "
                            "(default: an embedded cluster)")
    where.add_argument("--scheduler-file", default=None, metavar="FILE",
                       help="file written by `dask scheduler --scheduler-file FILE`, naming "
                            "the scheduler to use")
    where.add_argument("--cluster", choices=["local", "slurm"], default=None,
                       help="start a cluster: local (the default) or slurm (dask-jobqueue, "
                            "with --workers N)")
    g.add_argument("--jobqueue-config", default=None, metavar="YAML",
                   help="--cluster slurm: dask config file, e.g. deploy/slurm/jobqueue.yaml")
    g.add_argument("--jobqueue-option", type=_jobqueue_option, action="append", default=[],
                   metavar="KEY=VALUE",
                   help="--cluster slurm: override one jobqueue.slurm setting, the value in "
                        "YAML (repeatable), e.g. queue=debug, job-cpu=2, memory=4GiB, "
                        "'job-extra-directives=[]' (default: none)")
    g.add_argument("--no-tls", action="store_true",
                   help="embedded cluster without TLS (default: TLS with temporary "
                        "credentials)")
    g.add_argument("--no-shared-memory", dest="shared_memory", action="store_false",
                   help="send weights through Dask even to workers on this machine "
                        "(default: one shared-memory copy for them)")
    if dashboard:
        g.add_argument("--dashboard", nargs="?", const=True, default=None, type=_port,
                       metavar="PORT",
                       help="serve the embedded cluster's Dask dashboard on 127.0.0.1 (port "
                            f"{DASHBOARD_PORT} or the next free one; PORT, 0 for any free "
                            "one) and print its link to stderr; needs daskrl[dashboard] "
                            "(default: no dashboard, no HTTP server)")
    g.add_argument("--tls-ca-file", default=None, metavar="PEM",
                   help="CA certificate of a TLS cluster (tls:// addresses), with --tls-cert")
    g.add_argument("--tls-cert", default=None, metavar="PEM",
                   help="this client's certificate for a TLS cluster (may hold the key too)")
    g.add_argument("--tls-key", default=None, metavar="PEM",
                   help="this client's private key, unless the --tls-cert file holds it")


def deployment(args: argparse.Namespace, workers: int | None = None) -> Deployment | None:
    """The deployment the cluster flags name; ``None`` for the embedded default of ``collect``
    (the collector starts and closes it). ``workers`` sizes a cluster daskrl starts."""
    security = None
    if args.tls_ca_file or args.tls_cert or args.tls_key:
        if not (args.tls_ca_file and args.tls_cert):
            raise ConfigError("TLS needs --tls-ca-file and --tls-cert (and --tls-key unless "
                              "the certificate file holds the key).")
        security = tls_security(args.tls_ca_file, args.tls_cert, args.tls_key)
    if (args.jobqueue_config or args.jobqueue_option) and args.cluster != "slurm":
        raise ConfigError("--jobqueue-config and --jobqueue-option apply to --cluster slurm "
                          "only.")
    dashboard = getattr(args, "dashboard", None)
    if dashboard is not None and (args.scheduler or args.scheduler_file
                                  or args.cluster == "slurm"):
        raise ConfigError("--dashboard applies to the embedded cluster only: a running or "
                          "SLURM cluster serves its dashboard where its own configuration "
                          "says (dask scheduler --dashboard-address, jobqueue "
                          "scheduler-options).")
    if args.scheduler or args.scheduler_file:
        return connect(args.scheduler or "", scheduler_file=args.scheduler_file,
                       security=security)
    if args.cluster == "slurm":
        return _slurm(args, workers, security)
    if args.command == "collect" and security is None:
        return None
    options = {"dashboard": dashboard} if dashboard is not None else {}
    return connect("local", workers=workers, security=security, **options)


def print_dashboard_link(link: str | None) -> None:
    """Say where the embedded cluster's dashboard is (on stderr: stdout may be JSON)."""
    if link:
        print(f"dashboard: {link}", file=sys.stderr, flush=True)


def _slurm(args: argparse.Namespace, workers: int | None, security: Any) -> Deployment:
    if args.command == "collect" and not workers:
        raise ConfigError("--cluster slurm needs --workers N: how many workers (one per "
                          "job as in deploy/slurm/jobqueue.yaml) to ask SLURM for.")
    d = connect("slurm", workers=workers, security=security,
                jobqueue_config=args.jobqueue_config, **dict(args.jobqueue_option))
    if workers:  # jobs wait in the queue: longer than a collector waits for a worker
        print(f"waiting for SLURM to start the first of {workers} workers...", file=sys.stderr)
        try:
            # Gives up early, with the job's log, when a job ends without its worker.
            d.wait_for_workers(1, timeout=SLURM_QUEUE_WAIT_S)
        except BaseException:
            d.close()  # cancels the queued jobs
            raise
    return d
