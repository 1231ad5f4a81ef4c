"""Collect to a shared filesystem (FSx, Lustre, NFS) or an object store; train elsewhere.

This half collects: Dask workers step CartPole with uniformly random actions and write the
batches into a daskrl store under ``--store``, a path every worker and the training machine see
(``/fsx/$USER/cartpole-random``; or an fsspec URL such as ``s3://bucket/cartpole-random``).
The other half, ``fsx_train.py``, reads that store with no cluster at all.

Run::

    python examples/fsx_collect.py --store /fsx/$USER/cartpole-random
    python examples/fsx_collect.py --scheduler tcp://scheduler:8786 --store /fsx/...   # a cluster
    python examples/fsx_train.py --store /fsx/$USER/cartpole-random
"""

from __future__ import annotations

import argparse
import dataclasses
import time
import typing

import gymnasium as gym
from tqdm import tqdm

import daskrl
from daskrl.loggers import TensorBoardLogger
from daskrl.policies import MLPPolicy


@dataclasses.dataclass
class Args:
    store: str = "runs/fsx-demo"
    """store path or fsspec URL, seen by every worker and by the trainer (e.g. /fsx/...)"""
    env_id: str = "CartPole-v1"
    """the gymnasium id of the environment"""
    total_frames: int = 50_000
    """frames to collect"""
    num_workers: int = 2
    """Dask workers collecting in parallel"""
    envs_per_worker: int = 8
    """envs each worker steps together"""
    frames_per_batch: int = 1024
    """frames per batch (a multiple of envs_per_worker)"""
    seed: int = 0
    """seed of the collector's envs and action sampling"""
    scheduler: str = ""
    """address of a running Dask scheduler (default: an embedded LocalCluster of num_workers)"""
    progress: bool = True
    """show a progress bar"""
    tensorboard: str = ""
    """also log the collector's metrics (charts/episodic_return, charts/SPS, collector/...) to TensorBoard under this directory (pip install "daskrl[tensorboard]")"""


def parse_args() -> Args:
    """Command-line flags from the fields of :class:`Args` (``--total-frames 1000`` ...)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    hints = typing.get_type_hints(Args)
    for f in dataclasses.fields(Args):
        flag = "--" + f.name.replace("_", "-")
        if hints[f.name] is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        else:
            parser.add_argument(flag, type=hints[f.name], default=f.default)
    return Args(**vars(parser.parse_args()))


def main(args: Args) -> None:
    probe = gym.make(args.env_id)
    policy = MLPPolicy(probe.observation_space, probe.action_space)
    probe.close()
    client = None
    if args.scheduler:
        from distributed import Client

        client = Client(args.scheduler, set_as_default=False)
    start = time.perf_counter()
    try:
        with daskrl.Collector(
            args.env_id, policy, args.store, client=client, num_workers=args.num_workers,
            envs_per_worker=args.envs_per_worker, frames_per_batch=args.frames_per_batch,
            total_frames=args.total_frames, seed=args.seed,
            init_random_frames=args.total_frames,  # every action uniformly random
            loggers=[TensorBoardLogger(args.tensorboard)] if args.tensorboard else [],
        ) as collector, tqdm(total=args.total_frames, unit="frame", disable=not args.progress,
                             dynamic_ncols=True) as bar:
            for handle in collector:  # nothing to learn here: the handles only count
                bar.update(handle.frames)
            s = collector.summary()
    finally:
        if client is not None:
            client.close()
    elapsed = time.perf_counter() - start
    print(f"collected {s['frames']} frames in {s['batches']} batches, {elapsed:.1f}s "
          f"({s['frames'] / elapsed:.0f} frames/s), {s['episodes']} episodes, "
          f"mean return {s['mean_return']:.1f}")
    print(f"store: {s['store']}")
    print(f"train from it:  python examples/fsx_train.py --store {args.store}")


if __name__ == "__main__":
    main(parse_args())
