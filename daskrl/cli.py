"""The ``daskrl`` command line: ``daskrl collect`` runs a collection on the embedded default."""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from .errors import DaskrlError

__all__ = ["main"]


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


def _env_var(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--env-var takes NAME=VALUE, got {text!r}")
    return name, value


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
    c.add_argument("--env-kwargs", type=json.loads, default=None, help="JSON object for gymnasium.make")
    c.add_argument("--env-var", type=_env_var, action="append", default=[],
                   help="NAME=VALUE set on every worker (repeatable)")
    c.add_argument("--policy", default=None,
                   help="'module:factory' called with (observation_space, action_space); "
                        "default: an untrained 64-64 MLP")
    c.add_argument("--scheduler", default=None,
                   help="address of a running Dask scheduler (default: embedded LocalCluster)")
    c.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _collect(args: argparse.Namespace) -> int:
    import gymnasium as gym
    from tqdm import tqdm

    from .collector import Collector
    from .policies import MLPPolicy

    probe = gym.make(args.env, **(args.env_kwargs or {})) if args.env else None
    try:
        factory = _load_object(args.policy) if args.policy else MLPPolicy
        policy = factory(probe.observation_space, probe.action_space)
    finally:
        probe.close()
    client = None
    if args.scheduler:
        from distributed import Client

        client = Client(args.scheduler)
    try:
        with Collector(
            args.env, policy, args.store, client=client, envs_per_worker=args.envs_per_worker,
            frames_per_batch=args.frames_per_batch, total_frames=args.frames,
            max_frames_per_traj=args.max_frames_per_traj,
            init_random_frames=args.init_random_frames,
            reset_at_each_iter=args.reset_at_each_iter, sync=args.sync, device=args.device,
            env_kwargs=args.env_kwargs, env_vars=dict(args.env_var), seed=args.seed,
            num_workers=args.workers, compression=args.compression,
        ) as collector:
            with tqdm(total=args.frames, unit="frame", disable=args.no_progress,
                      dynamic_ncols=True) as bar:
                for handle in collector:
                    bar.update(handle.frames)
                    s = collector.summary()
                    bar.set_postfix(fps=f"{s['fps']:.0f}", ret=f"{s['mean_return']:.1f}")
            s = collector.summary()
            n_workers = len(collector.client.scheduler_info()["workers"])
    finally:
        if client is not None:
            client.close()
    mean = "n/a" if math.isnan(s["mean_return"]) else f"{s['mean_return']:.2f}"
    per_worker = ", ".join(f"{addr} {w['fps']:.0f} ({w['rollout_fps']:.0f} stepping)"
                           for addr, w in s["workers"].items())
    print(
        f"collected {s['frames']} frames in {s['batches']} batches on {n_workers} workers, "
        f"{s['seconds']:.1f}s ({s['fps']:.0f} frames/s)\n"
        f"frames/s per worker: {per_worker}\n"
        f"episodes finished: {s['episodes']}, mean return (last 100): {mean}\n"
        f"store: {s['store']}  (read it with daskrl.open_store({s['store']!r}))"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``daskrl`` command."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "collect":
            return _collect(args)
    except (DaskrlError, ValueError) as e:
        print(f"daskrl: error: {e}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
