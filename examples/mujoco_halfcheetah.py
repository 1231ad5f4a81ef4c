"""MuJoCo HalfCheetah-v5 on Dask workers: continuous actions, float64 observations.

Each worker steps ``HalfCheetah-v5`` (17 float64 joint positions and velocities; 6 torques in
[-1, 1]) with a Gaussian MLP policy (``daskrl.policies.MLPPolicy``: tanh-scaled means, the env
clips its samples to the bounds; untrained here: this example shows the data path, not
learning), the first ``--random-frames`` frames with uniform random actions, and writes each
batch to the store. The learner loads each batch onto ``--device`` and reports the returns and
what the store spends per frame; ``--float32`` stores float32 observations instead
(``gymnasium.wrappers.DtypeObservation``, as ``--wrapper`` on the command line).

Run::

    pip install -e ".[mujoco]"
    python examples/mujoco_halfcheetah.py               # 20,000 frames on 2 local workers

The same collection from the command line::

    daskrl collect --env HalfCheetah-v5 --store runs/cheetah --init-random-frames 4000

MuJoCo 4 logs a deprecation in gymnasium's HalfCheetah model ('settotalmass') to
``MUJOCO_LOG.TXT`` in the working directory of each process that builds the env.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
import typing
from pathlib import Path

import gymnasium as gym
import torch
from tqdm import tqdm

import daskrl
from daskrl.loggers import TensorBoardLogger
from daskrl.policies import MLPPolicy


@dataclasses.dataclass
class Args:
    env_id: str = "HalfCheetah-v5"
    """the gymnasium id of the MuJoCo task"""
    total_frames: int = 20_000
    """frames to collect"""
    random_frames: int = 4_000
    """the first frames use actions sampled uniformly from the action space"""
    max_episode_steps: int = 1000
    """truncate episodes at this many steps (HalfCheetah never terminates)"""
    num_workers: int = 2
    """Dask workers collecting in parallel"""
    envs_per_worker: int = 4
    """envs each worker steps together"""
    frames_per_batch: int = 2000
    """frames per batch (a multiple of envs_per_worker)"""
    float32: bool = False
    """store float32 observations (gymnasium.wrappers.DtypeObservation) instead of float64"""
    seed: int = 1
    """seed of the collector's envs and of the policy's sampling"""
    device: str = "cpu"
    """where the learner loads each batch (cpu, cuda, mps)"""
    run_dir: str = ""
    """where the store, metrics.jsonl and result.json go (default: runs/mujoco_halfcheetah__<seed>__<time>)"""
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


def main(args: Args) -> dict[str, typing.Any]:
    run_dir = Path(args.run_dir or f"runs/mujoco_halfcheetah__{args.seed}__{int(time.time())}")
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    wrappers = ["gymnasium.wrappers.DtypeObservation:dtype='float32'"] if args.float32 else []
    probe = gym.make(args.env_id)
    policy = MLPPolicy(probe.observation_space, probe.action_space)
    low, high = probe.action_space.low, probe.action_space.high
    probe.close()
    client = None
    if args.scheduler:
        from distributed import Client

        client = Client(args.scheduler, set_as_default=False)
    metrics = (run_dir / "metrics.jsonl").open("a")
    start = time.perf_counter()
    frames = 0
    in_bounds = True
    try:
        with daskrl.Collector(
            args.env_id, policy, str(run_dir / "store"), client=client, wrappers=wrappers,
            num_workers=args.num_workers, envs_per_worker=args.envs_per_worker,
            frames_per_batch=args.frames_per_batch, total_frames=args.total_frames,
            init_random_frames=args.random_frames, max_frames_per_traj=args.max_episode_steps,
            seed=args.seed,
            loggers=[TensorBoardLogger(args.tensorboard)] if args.tensorboard else [],
        ) as collector, tqdm(total=args.total_frames, unit="frame", disable=not args.progress,
                             dynamic_ncols=True) as bar:
            print(f"observation space {collector.observation_space}, "
                  f"action space {collector.action_space}")
            for handle in collector:
                frames += handle.frames
                bar.update(handle.frames)
                batch = handle.load(device=args.device, keys=["observation", "action"])
                obs, act = batch["observation"], batch["action"]  # [T, E, 17], [T, E, 6]
                assert obs.dtype == (torch.float32 if args.float32 else torch.float64)
                if frames <= args.random_frames:  # sampled from the space: within its bounds
                    a = act.cpu().numpy()
                    in_bounds &= bool(((a >= low) & (a <= high)).all())
                for ret, length in zip(handle.episode_returns, handle.episode_lengths):
                    metrics.write(json.dumps({"step": frames, "charts/episodic_return": ret,
                                              "charts/episodic_length": length}) + "\n")
                metrics.write(json.dumps({"step": frames, "charts/SPS": frames / (
                    time.perf_counter() - start)}) + "\n")
            summary = collector.summary()
            store = collector.store
    finally:
        metrics.close()
        if client is not None:
            client.close()
    elapsed = time.perf_counter() - start
    stored = [store.batch_sizes(h.batch_id, h.path) for h in store.handles()]
    chunk_bytes = sum(s[0] for s in stored if s is not None)
    result = {
        "frames": summary["frames"], "seconds": elapsed, "sps": summary["frames"] / elapsed,
        "episodes": summary["episodes"], "mean_return": summary["mean_return"],
        "bytes_per_frame": chunk_bytes / summary["frames"], "random_actions_in_bounds": in_bounds,
    }
    (run_dir / "result.json").write_text(json.dumps(result, indent=1))
    print(f"frames: {result['frames']}  time: {elapsed:.1f}s  SPS: {result['sps']:.0f}  "
          f"episodes: {result['episodes']}  mean return: {result['mean_return']:.1f}")
    print(f"stored: {result['bytes_per_frame']:.0f} bytes per frame; random actions within "
          f"the bounds: {in_bounds}")
    print(f"run dir: {run_dir}")
    return result


if __name__ == "__main__":
    main(parse_args())
