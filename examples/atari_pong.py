"""Atari Pong pixels on Dask workers: ale-py with gymnasium's Atari wrappers, 4x84x84 uint8.

Each worker steps ``ALE/Pong-v5`` with ``frameskip=1`` in the env (``AtariPreprocessing`` skips
4 frames itself, max-pools the last two, and makes them 84x84 grey) and
``FrameStackObservation(stack_size=4)``, samples actions from a Nature-CNN actor (the network
cleanrl's Atari PPO trains; untrained here: this example shows the data path, not learning),
and writes each batch of frame stacks into the store. The learner loads each batch onto
``--device``, runs the critic on its frames, and reports what the store spends per frame.
daskrl imports ``ale_py`` for ``ALE/...`` ids on every worker: nothing to register by hand.

Run::

    pip install -e ".[atari]"
    python examples/atari_pong.py                       # 8,192 frames on 2 local workers
    python examples/atari_pong.py --total-frames 100000 --envs-per-worker 16

The same collection from the command line (its default policy is an MLP, not a CNN)::

    daskrl collect --env ALE/Pong-v5 --env-kwargs '{"frameskip": 1}' --store runs/pong \\
        --wrapper gymnasium.wrappers.AtariPreprocessing \\
        --wrapper gymnasium.wrappers.FrameStackObservation:stack_size=4
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
import typing
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

import daskrl
from daskrl.loggers import TensorBoardLogger

WRAPPERS = ["gymnasium.wrappers.AtariPreprocessing",
            "gymnasium.wrappers.FrameStackObservation:stack_size=4"]


@dataclasses.dataclass
class Args:
    env_id: str = "ALE/Pong-v5"
    """the gymnasium id of the Atari game"""
    total_frames: int = 8192
    """frames (agent steps, 4 emulator frames each) to collect"""
    num_workers: int = 2
    """Dask workers collecting in parallel"""
    envs_per_worker: int = 8
    """envs each worker steps together"""
    frames_per_batch: int = 1024
    """frames per batch (a multiple of envs_per_worker)"""
    seed: int = 1
    """seed of the collector's envs and of the actor's sampling"""
    device: str = "cpu"
    """where the learner loads each batch (cpu, cuda, mps)"""
    run_dir: str = ""
    """where the store, metrics.jsonl and result.json go (default: runs/atari_pong__<seed>__<time>)"""
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


class NatureCNN(nn.Module):
    """The DQN paper's encoder with an actor and a critic head. ``forward`` is what the workers
    run on ``[E, 4, 84, 84]`` uint8 stacks: a sampled action and its log-probability."""

    def __init__(self, n_actions: int) -> None:
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(), nn.Linear(64 * 7 * 7, 512), nn.ReLU(),
        )
        self.actor = nn.Linear(512, n_actions)
        self.critic = nn.Linear(512, 1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.encoder(obs.float() / 255.0)).squeeze(-1)

    def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        dist = torch.distributions.Categorical(logits=self.actor(self.encoder(obs.float() / 255.0)))
        action = dist.sample()
        return {"action": action, "log_prob": dist.log_prob(action)}


def main(args: Args) -> dict[str, typing.Any]:
    run_dir = Path(args.run_dir or f"runs/atari_pong__{args.seed}__{int(time.time())}")
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    agent = NatureCNN(n_actions=6)  # Pong's minimal action set
    client = None
    if args.scheduler:
        from distributed import Client

        client = Client(args.scheduler, set_as_default=False)
    metrics = (run_dir / "metrics.jsonl").open("a")
    start = time.perf_counter()
    frames, values = 0, []
    try:
        with daskrl.Collector(
            args.env_id, agent, str(run_dir / "store"), client=client,
            env_kwargs={"frameskip": 1}, wrappers=WRAPPERS, num_workers=args.num_workers,
            envs_per_worker=args.envs_per_worker, frames_per_batch=args.frames_per_batch,
            total_frames=args.total_frames, seed=args.seed,
            loggers=[TensorBoardLogger(args.tensorboard)] if args.tensorboard else [],
        ) as collector, tqdm(total=args.total_frames, unit="frame", disable=not args.progress,
                             dynamic_ncols=True) as bar:
            print(f"observation space {collector.observation_space}, "
                  f"action space {collector.action_space}")
            for handle in collector:
                frames += handle.frames
                bar.update(handle.frames)
                batch = handle.load(device=args.device, keys=["observation", "reward"])
                obs = batch["observation"]  # [T, E, 4, 84, 84] uint8, as the env gave it
                assert obs.dtype == torch.uint8 and tuple(obs.shape[2:]) == (4, 84, 84)
                with torch.no_grad():
                    values.append(agent.to(args.device).value(obs.flatten(0, 1)).mean().item())
                for ret, length in zip(handle.episode_returns, handle.episode_lengths):
                    metrics.write(json.dumps({"step": frames, "charts/episodic_return": ret,
                                              "charts/episodic_length": length}) + "\n")
                metrics.write(json.dumps({"step": frames, "charts/SPS": frames / (
                    time.perf_counter() - start), "values/mean": values[-1]}) + "\n")
            summary = collector.summary()
            store = collector.store
    finally:
        metrics.close()
        if client is not None:
            client.close()
    elapsed = time.perf_counter() - start
    stored = [store.batch_sizes(h.batch_id, h.path) for h in store.handles()]
    chunk_bytes = sum(s[0] for s in stored if s is not None)
    raw_bytes = sum(s[1] for s in stored if s is not None)
    result = {
        "frames": summary["frames"], "seconds": elapsed, "sps": summary["frames"] / elapsed,
        "episodes": summary["episodes"], "mean_return": summary["mean_return"],
        "bytes_per_frame": chunk_bytes / summary["frames"],
        "compression_ratio": raw_bytes / max(chunk_bytes, 1),
    }
    (run_dir / "result.json").write_text(json.dumps(result, indent=1))
    print(f"frames: {result['frames']}  time: {elapsed:.1f}s  SPS: {result['sps']:.0f}  "
          f"episodes: {result['episodes']}")
    print(f"stored: {result['bytes_per_frame']:.0f} bytes per frame "
          f"(compression ratio {result['compression_ratio']:.0f}; a raw frame stack is "
          f"{4 * 84 * 84} bytes, twice per frame with next_observation)")
    print(f"run dir: {run_dir}")
    return result


if __name__ == "__main__":
    main(parse_args())
