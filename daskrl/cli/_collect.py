"""``daskrl collect``: its flags (the generated collection options, the env, the policy
factory, the store, where to run) and the run itself, with a progress bar and a summary."""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import sys
from typing import TYPE_CHECKING, Any

from daskrl.cli._early_cluster import EarlyCluster
from daskrl.cli._options import add_config_options, config_options
from daskrl.cli._store import json_object
from daskrl.cli._target import add_cluster_args, deployment, print_dashboard_link
from daskrl.deploy._cluster import dashboard_link, require_bokeh
from daskrl.errors import ConfigError, EnvError

if TYPE_CHECKING:
    from daskrl.collect._env_list import Resolved
    from daskrl.config import CollectorConfig

__all__ = ["add_collect_command", "run_collect"]


def _env_var(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--env-var takes NAME=VALUE, got {text!r}")
    return name, value


def add_collect_command(sub: Any) -> None:
    """Add ``collect`` to the ``daskrl`` subparsers ``sub``."""
    c = sub.add_parser("collect", help="collect experience into a store",
                       description="Collect experience with a policy into a zarr store, on "
                                   "an embedded cluster of this machine unless a --scheduler, "
                                   "--scheduler-file or --cluster is given.")
    c.add_argument("--env", required=True, action="append", metavar="ID",
                   help="gymnasium env id, e.g. CartPole-v1; 'module:Id' to import the module "
                        "that registers it; or 'module:factory', a callable of the module "
                        "making the env (called with --env-kwargs). Repeat it to collect "
                        "several envs with the same spaces, one per stream: stream s collects "
                        "the (s mod N)-th --env, and --workers, when given, must be a multiple "
                        "of N (required)")
    c.add_argument("--store", required=True, metavar="URL",
                   help="local path or fsspec URL of the store, e.g. ./runs/cartpole or "
                        "s3://bucket/prefix (required)")
    c.add_argument("--device", default="auto",
                   help="policy device on workers: auto (a worker's GPU if it has one, else "
                        "its CPU), cpu, cuda, cuda:N or mps")
    c.add_argument("--env-kwargs", type=json_object("--env-kwargs"), default=None,
                   metavar="JSON",
                   help="JSON object of keyword arguments for gymnasium.make, e.g. "
                        "'{\"gravity\": 9.8}' (default: the env's own)")
    c.add_argument("--vector-kwargs", type=json_object("--vector-kwargs"), default=None,
                   metavar="JSON",
                   help="with --vectorization-mode: JSON object of keyword arguments for the "
                        "vector env (gymnasium.make_vec's vector_kwargs), e.g. "
                        "'{\"autoreset_mode\": \"SameStep\"}' (default: none)")
    c.add_argument("--env-var", type=_env_var, action="append", default=[],
                   metavar="NAME=VALUE",
                   help="an environment variable set on every worker before its envs are "
                        "built (repeatable; default: none)")
    c.add_argument("--wrapper", action="append", default=[], metavar="PATH[:KEY=VALUE,...]",
                   help="a gymnasium wrapper applied to every env, in the order given "
                        "(repeatable), e.g. gymnasium.wrappers.AtariPreprocessing or "
                        "gymnasium.wrappers.FrameStackObservation:stack_size=4; values are "
                        "Python literals (quote text: mode='rgb'); default: none")
    c.add_argument("--policy", default=None, metavar="MODULE:FACTORY",
                   help="'module:factory' called with (observation_space, action_space), "
                        "returning a torch.nn.Module (default: an untrained 64-64 MLP)")
    c.add_argument("--no-progress", action="store_true",
                   help="no progress bar (default: a progress bar on stderr)")
    c.add_argument("--json", action="store_true",
                   help="print the collector's summary as one JSON object instead of text "
                        "(and no progress bar)")
    c.add_argument("--tensorboard", default=None, metavar="DIR",
                   help="also write the running metrics (charts/episodic_return, charts/SPS, "
                        "collector/..., see docs/integrations/logging.md) as TensorBoard event "
                        'files under DIR (needs pip install "daskrl[tensorboard]"; default: off)')
    add_config_options(c)
    add_cluster_args(c, dashboard=True)


def _load_object(spec: str) -> Any:
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ConfigError(f"--policy must look like 'package.module:factory', got {spec!r}.")
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"--policy {spec!r}: cannot import {module!r}: {e}") from e
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise ConfigError(f"--policy {spec!r}: {module!r} has no attribute {attr!r}.") from e
    return obj


def make_policy(spec: str | None, obs_space: Any, act_space: Any) -> Any:
    """The ``--policy`` factory's module for the env's spaces (default: an untrained MLP)."""
    import torch

    from daskrl.policies import MLPPolicy

    if spec is None:
        return MLPPolicy(obs_space, act_space)
    factory = _load_object(spec)
    if not callable(factory):
        raise ConfigError(f"--policy {spec!r} is a {type(factory).__name__}, not a callable.")
    try:
        inspect.signature(factory).bind(obs_space, act_space)
    except TypeError as e:
        raise ConfigError(
            f"--policy {spec!r} cannot be called as factory(observation_space, action_space) "
            f"({e}): give it those two parameters, e.g. def make_policy(observation_space, "
            "action_space) -> torch.nn.Module."
        ) from None
    except ValueError:  # no signature to inspect (some builtins): just call it
        pass
    try:
        module = factory(obs_space, act_space)
    except Exception as e:
        raise ConfigError(
            f"--policy {spec!r} raised when called with the env's spaces: "
            f"{type(e).__name__}: {e}"
        ) from e
    if not isinstance(module, torch.nn.Module):
        raise ConfigError(
            f"--policy {spec!r} returned a {type(module).__name__}; the factory must return a "
            "torch.nn.Module."
        )
    return module


def _embedded(args: argparse.Namespace) -> bool:
    """Whether ``collect``'s cluster flags leave the embedded default (no scheduler, no SLURM,
    no TLS files of a cluster of one's own)."""
    return not (args.scheduler or args.scheduler_file or args.cluster == "slurm"
                or args.tls_ca_file or args.tls_cert or args.tls_key)


def run_collect(args: argparse.Namespace) -> int:
    """Run ``daskrl collect``; print the summary; the exit status."""
    from daskrl.collect._env_list import resolve_envs
    from daskrl.config import CollectorConfig

    by_hand = {"device": args.device, "env_kwargs": args.env_kwargs,
               "env_vars": dict(args.env_var), "shared_memory": args.shared_memory,
               "wrappers": tuple(args.wrapper), "vector_kwargs": args.vector_kwargs}
    values = {**{o.field: getattr(args, o.field) for o in config_options()}, **by_hand}
    given = bool(getattr(args, "envs_per_worker_given", False))
    # bad values fail before the env is made (envs_per_worker, where a vector env may give
    # it, once the env is made)
    CollectorConfig(**{**values, "envs_per_worker": args.envs_per_worker if given else 1})
    if args.dashboard is not None:
        require_bokeh()  # before the env is made
    env = args.env[0] if len(args.env) == 1 else list(args.env)
    try:  # with the wrappers: the policy is made for the spaces the workers' envs have
        resolved = resolve_envs(env, values, given)
    except EnvError as e:  # made here, before any cluster: the env id or its kwargs are wrong
        raise ConfigError(str(e)) from e
    config, obs_space, act_space = (resolved.config, resolved.observation_space,
                                    resolved.action_space)
    if config.resume is not False:  # a run it cannot resume fails before any cluster starts
        _check_resume(args.store, config, resolved)
    early: EarlyCluster | None = None
    if _embedded(args) and deployment(args, workers=config.num_workers) is None:
        # Input checked (the policy's factory aside): the embedded cluster's workers start
        # and import torch while this process imports it and builds the policy.
        early = EarlyCluster(n_workers=config.num_workers, dashboard=args.dashboard,
                             processes=not str(args.store).startswith("memory://"))
    try:
        policy = make_policy(args.policy, obs_space, act_space)  # imports torch

        from tqdm import tqdm

        from daskrl.collect._collector import Collector

        loggers = []
        if args.tensorboard is not None:  # a missing extra fails before any batch
            from daskrl.loggers import TensorBoardLogger

            loggers.append(TensorBoardLogger(args.tensorboard))
        if config.resume is False:
            _note_earlier_runs(args.store)
        d = early.deployment() if early is not None else deployment(
            args, workers=config.num_workers)
    except BaseException:
        if early is not None:
            early.close()
        raise
    try:
        with Collector(env, policy, args.store,
                       client=d.client if d is not None else None, config=config,
                       dashboard=args.dashboard if d is None else None,
                       loggers=loggers) as collector:
            print_dashboard_link(collector.dashboard_link
                                 or (dashboard_link(d.cluster) if d is not None else None))
            resumed = collector.resumed
            if resumed is not None:
                _note_resume(args.store, resumed, collector.run_number)
            with tqdm(total=config.total_frames, unit="frame",
                      initial=resumed.frames if resumed is not None else 0,
                      disable=args.no_progress or args.json,
                      dynamic_ncols=True) as bar:
                for handle in collector:
                    bar.update(handle.frames)
                    s = collector.summary()
                    bar.set_postfix(fps=f"{s['fps']:.0f}", ret=f"{s['mean_return']:.1f}")
            s = collector.summary()
            n_workers = len(collector.client.scheduler_info()["workers"])
            transport = collector.weights_transport
    finally:
        for target in loggers:  # closed with the collector already, unless it failed first
            target.close()
        if d is not None:
            d.close()
    resume = {"resumes": resumed.run if resumed is not None else None,
              "resumed_frames": resumed.frames if resumed is not None else 0}
    if args.json:
        print(json.dumps(_plain({**s, "run": collector.run_number, "num_workers": n_workers,
                                 "weights_transport": transport, **resume}), allow_nan=False))
        return 0
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
        + (f"\nresumed run {resumed.run}: {resumed.frames} frames were committed before, "
           f"{resumed.frames + s['frames']} in all" if resumed is not None else "")
    )
    return 0


def _plain(value: Any) -> Any:
    """``value`` as strict JSON values: NaN (no episode finished yet) becomes null, numpy
    scalars numbers, mapping keys strings."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _note_resume(store: str, resumed: Any, run: int) -> None:
    """Say what a resumed collection continues, and what is left to collect (the collector
    itself warns when nothing is left, or when the store has no run to resume)."""
    if resumed.complete:
        return
    left = "until interrupted" if resumed.frames_left is None else f"{resumed.frames_left} more"
    print(f"daskrl: note: resuming run {resumed.run} of the store {store!r} as run {run}: "
          f"{resumed.frames} frames committed, collecting {left}.", file=sys.stderr)


def _check_resume(store: str, config: CollectorConfig, resolved: Resolved) -> None:
    """Raise what ``Collector(resume=...)`` would about the run to resume (not in the store,
    settings that differ), here, before the embedded cluster starts early (the collector
    counts its frames and says when there is no run to resume). A store that cannot be
    opened is left to the collector to explain."""
    from daskrl.collect._env_list import env_labels
    from daskrl.collect._resume import find_resume, run_settings
    from daskrl.errors import StoreError
    from daskrl.store._store import TrajectoryStore

    try:
        target = TrajectoryStore(store)
    except StoreError:
        return
    find_resume(target, config.resume, run_settings(
        env_labels(resolved.specs), resolved.observation_space, resolved.action_space, config))


def _note_earlier_runs(store: str) -> None:
    """Say so when the store already holds runs: this collection adds one more."""
    from daskrl.store._store import TrajectoryStore

    try:
        runs = TrajectoryStore(store).runs()
    except Exception:  # a new store, or one the collector will explain (best effort)
        return
    if runs:
        print(f"daskrl: note: the store {store!r} already holds {len(runs)} run(s) "
              f"({', '.join(str(r) for r in sorted(runs))}); this collection adds run "
              f"{max(runs) + 1} (its batches stay apart by run; use a new store to start "
              "afresh, or --resume to continue the latest run).", file=sys.stderr)
