"""The ``daskrl`` command line: ``daskrl collect`` runs a collection on the embedded default;
``daskrl inspect``, ``gc`` and ``prune`` look after a store."""

from __future__ import annotations

import argparse
import importlib
import inspect
import math
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import Any

from daskrl.cli._store import add_store_commands, json_object, run_store_command
from daskrl.deploy._slurm import option_name
from daskrl.errors import DaskrlError

__all__ = ["main"]

SLURM_QUEUE_WAIT_S = 3600
"""``--cluster slurm``: how long to wait for the first worker's job to start (a job that ends
before its worker joined stops the wait at once)."""


def _load_object(spec: str) -> Any:
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise DaskrlError(f"--policy must look like 'package.module:factory', got {spec!r}.")
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as e:
        raise DaskrlError(f"--policy {spec!r}: cannot import {module!r}: {e}") from e
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise DaskrlError(f"--policy {spec!r}: {module!r} has no attribute {attr!r}.") from e
    return obj


def _make_policy(spec: str | None, obs_space: Any, act_space: Any) -> Any:
    """The ``--policy`` factory's module for the env's spaces (default: an untrained MLP)."""
    import torch

    from daskrl.policies import MLPPolicy

    if spec is None:
        return MLPPolicy(obs_space, act_space)
    factory = _load_object(spec)
    if not callable(factory):
        raise DaskrlError(f"--policy {spec!r} is a {type(factory).__name__}, not a callable.")
    try:
        inspect.signature(factory).bind(obs_space, act_space)
    except TypeError as e:
        raise DaskrlError(
            f"--policy {spec!r} cannot be called as factory(observation_space, action_space) "
            f"({e}): give it those two parameters, e.g. def make_policy(observation_space, "
            "action_space) -> torch.nn.Module."
        ) from None
    except ValueError:  # no signature to inspect (some builtins): just call it
        pass
    try:
        module = factory(obs_space, act_space)
    except Exception as e:
        raise DaskrlError(
            f"--policy {spec!r} raised when called with the env's spaces: "
            f"{type(e).__name__}: {e}"
        ) from e
    if not isinstance(module, torch.nn.Module):
        raise DaskrlError(
            f"--policy {spec!r} returned a {type(module).__name__}; the factory must return a "
            "torch.nn.Module."
        )
    return module


def _env_var(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--env-var takes NAME=VALUE, got {text!r}")
    return name, value


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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="daskrl", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect", help="collect experience into a store",
                       description="Collect experience with a policy into a zarr store.")
    c.add_argument("--env", required=True, help="gymnasium id, e.g. CartPole-v1")
    c.add_argument("--store", required=True, help="local path or fsspec URL of the store")
    c.add_argument("--frames", type=int, default=100_000, help="total frames (default 100000)")
    c.add_argument("--frames-per-batch", type=int, default=4096)
    c.add_argument("--envs-per-worker", type=int, default=8)
    c.add_argument("--workers", type=int, default=None,
                   help="parallel streams; with the embedded cluster also its size (default: cores)")
    c.add_argument("--max-frames-per-traj", type=int, default=None)
    c.add_argument("--init-random-frames", type=int, default=0)
    c.add_argument("--reset-at-each-iter", action="store_true")
    c.add_argument("--async", dest="sync", action="store_false",
                   help="first finished, first out (default: synchronous rounds)")
    c.add_argument("--device", default="auto", help="policy device on workers (default auto)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--compression", default="zstd", choices=["zstd", "lz4", "none"])
    c.add_argument("--env-kwargs", type=json_object("--env-kwargs"), default=None,
                   help="JSON object for gymnasium.make")
    c.add_argument("--env-var", type=_env_var, action="append", default=[],
                   help="NAME=VALUE set on every worker (repeatable)")
    c.add_argument("--policy", default=None,
                   help="'module:factory' called with (observation_space, action_space); "
                        "default: an untrained 64-64 MLP")
    _add_cluster_args(c)
    c.add_argument("--no-progress", action="store_true", help="no progress bar")
    i = sub.add_parser("info", help="show a cluster's workers, devices and package versions",
                       description="Show a cluster's workers, the device each would collect "
                       "on, and package versions next to this machine's. Exit status 1 when a "
                       "worker's versions differ or its device cannot be used.")
    _add_cluster_args(i)
    add_store_commands(sub)
    debug = "on an error, print the full error and its traceback (default: one line)"
    p.add_argument("--debug", action="store_true", help=debug)
    for command in sub.choices.values():  # also after the command: daskrl collect --debug
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help=debug)
    return p


def _add_cluster_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster (default: an embedded LocalCluster on this machine)")
    where = g.add_mutually_exclusive_group()
    where.add_argument("--scheduler", default=None, metavar="ADDRESS",
                       help="address of a running Dask scheduler, e.g. tcp://head:8786")
    where.add_argument("--scheduler-file", default=None, metavar="FILE",
                       help="file written by `dask scheduler --scheduler-file FILE`")
    where.add_argument("--cluster", choices=["local", "slurm"], default=None,
                       help="start a cluster: local (default) or slurm (dask-jobqueue)")
    g.add_argument("--jobqueue-config", default=None, metavar="YAML",
                   help="--cluster slurm: dask config file, e.g. deploy/slurm/jobqueue.yaml")
    g.add_argument("--jobqueue-option", type=_jobqueue_option, action="append", default=[],
                   metavar="KEY=VALUE",
                   help="--cluster slurm: override one jobqueue.slurm setting, the value in "
                        "YAML (repeatable), e.g. queue=debug, job-cpu=2, memory=4GiB, "
                        "'job-extra-directives=[]'")
    g.add_argument("--no-tls", action="store_true",
                   help="embedded cluster without TLS (default: TLS with temporary credentials)")
    g.add_argument("--no-shared-memory", dest="shared_memory", action="store_false",
                   help="send weights through Dask even to workers on this machine")
    g.add_argument("--tls-ca-file", default=None, metavar="PEM")
    g.add_argument("--tls-cert", default=None, metavar="PEM")
    g.add_argument("--tls-key", default=None, metavar="PEM")


def _collect(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from daskrl.collect._collector import Collector
    from daskrl.worker._envs import EnvSpec

    obs_space, act_space = EnvSpec(args.env, args.env_kwargs or {}).probe()
    policy = _make_policy(args.policy, obs_space, act_space)
    deployment = _deployment(args, workers=args.workers)
    client = deployment.client if deployment is not None else None
    try:
        with Collector(
            args.env, policy, args.store, client=client, envs_per_worker=args.envs_per_worker,
            frames_per_batch=args.frames_per_batch, total_frames=args.frames,
            max_frames_per_traj=args.max_frames_per_traj,
            init_random_frames=args.init_random_frames,
            reset_at_each_iter=args.reset_at_each_iter, sync=args.sync, device=args.device,
            env_kwargs=args.env_kwargs, env_vars=dict(args.env_var), seed=args.seed,
            num_workers=args.workers, compression=args.compression,
            shared_memory=args.shared_memory,
        ) as collector:
            with tqdm(total=args.frames, unit="frame", disable=args.no_progress,
                      dynamic_ncols=True) as bar:
                for handle in collector:
                    bar.update(handle.frames)
                    s = collector.summary()
                    bar.set_postfix(fps=f"{s['fps']:.0f}", ret=f"{s['mean_return']:.1f}")
            s = collector.summary()
            n_workers = len(collector.client.scheduler_info()["workers"])
            transport = collector.weights_transport
    finally:
        if deployment is not None:
            deployment.close()
    mean = "n/a" if math.isnan(s["mean_return"]) else f"{s['mean_return']:.2f}"
    per_worker = ", ".join(f"{addr} {w['fps']:.0f} ({w['rollout_fps']:.0f} stepping)"
                           for addr, w in s["workers"].items())
    print(
        f"collected {s['frames']} frames in {s['batches']} batches on {n_workers} workers, "
        f"{s['seconds']:.1f}s ({s['fps']:.0f} frames/s)\n"
        f"frames/s per worker: {per_worker}\n"
        f"weights to workers: {transport.replace('-', ' ')}\n"
        f"episodes finished: {s['episodes']}, mean return (last 100): {mean}\n"
        f"store: {s['store']}  (read it with daskrl.open_store({s['store']!r}))"
    )
    return 0


def _deployment(args: argparse.Namespace, workers: int | None = None) -> Any:
    """The ``daskrl.deploy.Deployment`` the cluster arguments name; ``None`` for the embedded
    default of ``collect`` (the collector starts and closes it)."""
    from daskrl.deploy._connect import connect, tls_security

    security = None
    if args.tls_ca_file or args.tls_cert or args.tls_key:
        if not (args.tls_ca_file and args.tls_cert):
            raise DaskrlError("TLS needs --tls-ca-file and --tls-cert (and --tls-key unless "
                              "the certificate file holds the key).")
        security = tls_security(args.tls_ca_file, args.tls_cert, args.tls_key)
    if (args.jobqueue_config or args.jobqueue_option) and args.cluster != "slurm":
        raise DaskrlError("--jobqueue-config and --jobqueue-option apply to --cluster slurm "
                          "only.")
    if args.scheduler or args.scheduler_file:
        return connect(args.scheduler or "", scheduler_file=args.scheduler_file,
                       security=security)
    if args.cluster == "slurm":
        if args.command == "collect" and not workers:
            raise DaskrlError("--cluster slurm needs --workers N: how many workers (one per "
                              "job as in deploy/slurm/jobqueue.yaml) to ask SLURM for.")
        deployment = connect("slurm", workers=workers, security=security,
                             jobqueue_config=args.jobqueue_config, **dict(args.jobqueue_option))
        if workers:  # jobs wait in the queue: longer than a collector waits for a worker
            print(f"waiting for SLURM to start the first of {workers} workers...",
                  file=sys.stderr)
            try:
                # Gives up early, with the job's log, when a job ends without its worker.
                deployment.wait_for_workers(1, timeout=SLURM_QUEUE_WAIT_S)
            except BaseException:
                deployment.close()  # cancels the queued jobs
                raise
        return deployment
    if args.command == "collect" and security is None:
        return None
    return connect("local", workers=workers, security=security or None)


def _info(args: argparse.Namespace) -> int:
    from daskrl.deploy._connect import worker_report
    from daskrl.deploy._versions import CHECKED_PACKAGES, format_table, version_differences

    deployment = _deployment(args)
    try:
        client = deployment.client
        if hasattr(deployment.cluster, "job_script"):  # a dask-jobqueue cluster: show its job
            print(f"job script:\n{deployment.cluster.job_script()}")
        report = worker_report(client)
        versions = client.get_versions(packages=list(CHECKED_PACKAGES))
        print(f"scheduler: {client.scheduler.address}  ({len(report)} workers)\n")
        cols = ["worker", "name", "threads", "device", "DASKRL_DEVICE", "CUDA_VISIBLE_DEVICES"]
        rows = [[addr, *(r[c] or "-" for c in cols[1:])] for addr, r in report.items()]
        print(format_table(cols, rows))
        diffs = version_differences(versions)
        mine = versions["client"]["packages"]
        rows = []
        for pkg in CHECKED_PACKAGES:
            seen: dict[str, int] = {}
            for info in versions["workers"].values():
                v = (info or {}).get("packages", {}).get(pkg) or "not installed"
                seen[v] = seen.get(v, 0) + 1
            workers = ", ".join(f"{v} ({n})" for v, n in sorted(seen.items())) or "-"
            same = all(pkg not in d for d in diffs.values())
            rows.append([pkg, mine.get(pkg) or "not installed", workers,
                         "ok" if same else "DIFFERS"])
        print()
        print(format_table(["package", "this machine", "workers (count)", ""], rows))
        bad_devices = [a for a, r in report.items() if r["device"].startswith("error")]
        if diffs or bad_devices:
            print(f"\n{len(diffs)} worker(s) with other versions, {len(bad_devices)} with an "
                  "unusable device.", file=sys.stderr)
            return 1
        return 0
    finally:
        deployment.close()


def error_line(e: BaseException) -> str:
    """One line for an error: its message's first line, plus the worker and weights version a
    worker's error names; ``--debug`` shows the rest (the env's or policy's traceback...)."""
    if isinstance(e, DaskrlError) and e.whole_message:
        return str(e)
    lines = [line for line in str(e).splitlines() if line.strip()] or [""]
    text = lines[0]
    where = [line for line in lines[1:] if line.startswith("[worker ")]
    if where:
        text = f"{text} {where[-1]}"
    if not isinstance(e, DaskrlError):
        text = f"{type(e).__name__}: {text}".rstrip(": ")
    if len(lines) > 1 + len(where) or not isinstance(e, (DaskrlError, ValueError)):
        text += " (--debug shows the full error)"
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``daskrl`` command.

    Errors print one line (``daskrl: error: ...``) and exit with status 2 (1 for an
    unexpected error, 130 when interrupted); ``--debug`` prints the traceback too.
    """
    import dask

    args = _parser().parse_args(argv)
    # SIGTERM (scancel, kill, a batch system ending the job) unwinds like Ctrl-C, so that a
    # SLURM cluster's jobs are cancelled and its TLS key files deleted on the way out.
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if in_main_thread else None
    debug = getattr(args, "debug", False)
    config: dict[str, Any] = {}
    if getattr(args, "no_tls", False):
        config["daskrl.embedded-cluster.tls"] = False
    if not debug:  # a batch's error reaches this process and is printed once, in one line
        config["daskrl.embedded-cluster.log-level"] = "critical"
    try:
        with dask.config.set(config):
            if args.command == "collect":
                return _collect(args)
            if args.command == "info":
                return _info(args)
            code = run_store_command(args)
            if code is not None:
                return code
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print("daskrl: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if debug:
            traceback.print_exc()
        print(f"daskrl: error: {error_line(e)}", file=sys.stderr)
        return 2 if isinstance(e, (DaskrlError, ValueError)) else 1
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
    return 1


def _exit_on_sigterm(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends at once
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
