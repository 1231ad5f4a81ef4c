"""DQN on CartPole-v1, off-policy and asynchronous, with a replay read from the daskrl store.

Workers collect with an epsilon-greedy Q-network (``rounds=False``: each worker starts its next
batch at once with the newest weights it has); the learner takes batches first-finished-first,
reads each one from the store into a replay, and does gradient steps on uniform samples of it
while the workers go on collecting. Epsilon is a buffer of the Q-network, so it travels to the
workers with the weights. Every handle records its policy lag (weights versions behind the
learner when handed over); their statistics are printed at the end.

Run::

    python examples/dqn_cartpole.py                     # 150k frames on 2 local workers
    python examples/dqn_cartpole.py --help

Metrics go to ``<run dir>/metrics.jsonl`` (``charts/episodic_return``, ``charts/SPS``,
``losses/td_loss``, ``collector/policy_lag_mean`` ...), and with ``--tensorboard DIR`` to
TensorBoard too (the collector's through ``daskrl.loggers.TensorBoardLogger``, the learner's
through the same logger); the learning curve to ``<run dir>/curve.png``
(``pip install "daskrl[examples]"``).
"""

from __future__ import annotations

import argparse
import collections
import copy
import dataclasses
import json
import time
import typing
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

import daskrl
from daskrl.loggers import TensorBoardLogger


@dataclasses.dataclass
class Args:
    env_id: str = "CartPole-v1"
    """the gymnasium id of the environment"""
    total_frames: int = 150_000
    """frames (env steps) to collect in all"""
    num_workers: int = 2
    """Dask workers collecting in parallel"""
    envs_per_worker: int = 8
    """envs each worker steps together"""
    steps_per_batch: int = 32
    """steps of each env per batch"""
    batches_in_flight: int = 2
    """batches queued or running per worker (backpressure when the learner is slower)"""
    max_policy_lag: int = -1
    """drop batches more than this many weights versions stale (-1: keep every batch)"""
    seed: int = 1
    """seed of the learner's torch and of the collector's envs and policy sampling"""
    learning_rate: float = 1e-3
    """Adam's learning rate"""
    anneal_lr: bool = True
    """decay the learning rate linearly to 0 over the run (late updates stop undoing the policy)"""
    buffer_size: int = 100_000
    """frames the replay keeps (oldest dropped first)"""
    gamma: float = 0.99
    """discount"""
    batch_size: int = 64
    """transitions per gradient step"""
    gradient_steps_per_frame: float = 0.5
    """gradient steps per collected frame (128 per batch of 256 frames)"""
    target_update_interval: int = 256
    """gradient steps between copies of the Q-network into the target network"""
    double_q: bool = True
    """double DQN: the online network picks the next action, the target network values it"""
    learning_starts: int = 1_000
    """frames collected with uniformly random actions before learning starts"""
    start_epsilon: float = 1.0
    """exploration at the start"""
    end_epsilon: float = 0.04
    """exploration after exploration_frames"""
    exploration_frames: int = 16_000
    """frames over which epsilon decays linearly"""
    max_grad_norm: float = 10.0
    """gradient clipping"""
    hidden: int = 256
    """units of the Q-network's two hidden layers"""
    target_return: float = 400.0
    """report the frames at which the mean return of the last `window` episodes reaches this"""
    window: int = 20
    """episodes in the running mean compared with target_return"""
    run_dir: str = ""
    """where the store, metrics.jsonl and curve.png go (default: runs/dqn_cartpole__<seed>__<time>)"""
    scheduler: str = ""
    """address of a running Dask scheduler (default: an embedded LocalCluster of num_workers)"""
    plot: bool = True
    """save the learning curve as <run dir>/curve.png (needs matplotlib)"""
    progress: bool = True
    """show a progress bar"""
    torch_threads: int = 1
    """torch threads of the learner: one is fastest for small MLPs next to busy workers"""
    tensorboard: str = ""
    """also log to TensorBoard under this directory: the collector's metrics (charts/episodic_return, charts/SPS, collector/...) and the learner's (pip install "daskrl[tensorboard]")"""


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


class QNetwork(nn.Module):
    """Q-values of every action; ``forward`` (what workers run) acts epsilon-greedily."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, n_actions))
        self.n_actions = n_actions
        self.register_buffer("epsilon", torch.tensor(1.0))  # shipped with the weights

    def q(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.float())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        greedy = self.q(obs).argmax(-1)
        n = obs.shape[0]
        explore = torch.rand(n, device=obs.device) < self.epsilon
        random = torch.randint(self.n_actions, (n,), device=obs.device)
        return torch.where(explore, random, greedy)


class StoreReplay:
    """A replay of transitions read from a daskrl store, batch by batch.

    ``add(handle)`` loads the batch's arrays from the store (``handle.load``) and flattens its
    ``[T, E]`` steps into transitions; the oldest are dropped beyond ``capacity``.
    ``sample(n)`` draws ``n`` transitions uniformly.
    """

    KEYS = ("observation", "action", "reward", "next_observation", "terminated")

    def __init__(self, capacity: int, generator: torch.Generator) -> None:
        self.capacity = capacity
        self.generator = generator
        self.chunks: collections.deque[dict[str, torch.Tensor]] = collections.deque()
        self.size = 0
        self._flat: dict[str, torch.Tensor] | None = None

    def add(self, handle: daskrl.BatchHandle) -> None:
        batch = handle.load(keys=self.KEYS)
        self.chunks.append({k: v.flatten(0, 1) for k, v in batch.items()})
        self.size += handle.frames
        while self.size - len(self.chunks[0]["reward"]) >= self.capacity:
            self.size -= len(self.chunks.popleft()["reward"])
        self._flat = None

    def sample(self, n: int) -> dict[str, torch.Tensor]:
        if self._flat is None:
            self._flat = {k: torch.cat([c[k] for c in self.chunks]) for k in self.KEYS}
        idx = torch.randint(self.size, (n,), generator=self.generator)
        return {k: v[idx] for k, v in self._flat.items()}


def td_step(q: QNetwork, target: QNetwork, optimizer: torch.optim.Optimizer,
            batch: dict[str, torch.Tensor], args: Args) -> float:
    """One DQN gradient step; ``next_observation`` is the true successor, and only
    ``terminated`` (not a time-limit truncation) stops the bootstrap."""
    with torch.no_grad():
        next_obs = batch["next_observation"]
        if args.double_q:
            best = q.q(next_obs).argmax(-1, keepdim=True)
            next_q = target.q(next_obs).gather(1, best).squeeze(1)
        else:
            next_q = target.q(next_obs).max(-1).values
        y = batch["reward"] + args.gamma * next_q * (~batch["terminated"]).float()
    q_taken = q.q(batch["observation"]).gather(1, batch["action"].long()[:, None]).squeeze(1)
    loss = F.smooth_l1_loss(q_taken, y)
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(q.parameters(), args.max_grad_norm)
    optimizer.step()
    return float(loss.item())


class MetricsLog:
    """Appends ``{"step": frames, key: value, ...}`` lines to a JSONL file."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("a")

    def log(self, step: int, **metrics: float) -> None:
        self.file.write(json.dumps({"step": step, **metrics}) + "\n")

    def close(self) -> None:
        self.file.close()


def save_curve(path: Path, frames: list[int], returns: list[float], window: int,
               target: float, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(frames, returns, ".", ms=2, alpha=0.3, label="episode return")
    if len(returns) >= window:
        running = np.convolve(returns, np.ones(window) / window, mode="valid")
        ax.plot(frames[window - 1:], running, label=f"mean of last {window} episodes")
    ax.axhline(target, color="gray", ls="--", lw=1, label=f"target {target:g}")
    ax.set_xlabel("frames")
    ax.set_ylabel("return")
    ax.set_title(title)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(args: Args) -> dict[str, typing.Any]:
    run_dir = Path(args.run_dir or f"runs/dqn_cartpole__{args.seed}__{int(time.time())}")
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.torch_threads)
    torch.manual_seed(args.seed)
    probe = gym.make(args.env_id)
    q = QNetwork(int(np.prod(probe.observation_space.shape)), int(probe.action_space.n),
                 args.hidden)
    probe.close()
    target = copy.deepcopy(q)
    optimizer = torch.optim.Adam(q.parameters(), lr=args.learning_rate)
    replay = StoreReplay(args.buffer_size, torch.Generator().manual_seed(args.seed))
    client = None
    if args.scheduler:
        from distributed import Client

        client = Client(args.scheduler, set_as_default=False)
    metrics = MetricsLog(run_dir / "metrics.jsonl")
    # The collector logs its metrics to TensorBoard itself (and closes the logger with it).
    tb = TensorBoardLogger(args.tensorboard) if args.tensorboard else None
    curve_frames: list[int] = []
    curve_returns: list[float] = []
    recent: collections.deque[float] = collections.deque(maxlen=args.window)
    reached_at = None
    gradient_steps = 0
    owed = 0.0  # gradient steps earned by collected frames, not yet taken
    start = time.perf_counter()
    try:
        with daskrl.Collector(
            args.env_id, q, str(run_dir / "store"), client=client, rounds=False,
            num_workers=args.num_workers, envs_per_worker=args.envs_per_worker,
            frames_per_batch=args.envs_per_worker * args.steps_per_batch,
            total_frames=args.total_frames, seed=args.seed,
            init_random_frames=args.learning_starts, batches_in_flight=args.batches_in_flight,
            max_policy_lag=None if args.max_policy_lag < 0 else args.max_policy_lag,
            loggers=[tb] if tb is not None else [],
        ) as collector, tqdm(total=args.total_frames, unit="frame", disable=not args.progress,
                             dynamic_ncols=True) as bar:
            frames = 0
            for handle in collector:
                frames += handle.frames
                bar.update(handle.frames)
                for ret, length in zip(handle.episode_returns, handle.episode_lengths):
                    metrics.log(frames, **{"charts/episodic_return": ret,
                                           "charts/episodic_length": length})
                    curve_frames.append(frames)
                    curve_returns.append(ret)
                    recent.append(ret)
                    if (reached_at is None and len(recent) == args.window
                            and np.mean(recent) >= args.target_return):
                        reached_at = frames
                        bar.write(f"reached a mean return of {np.mean(recent):.1f} over the last "
                                  f"{args.window} episodes at {frames} frames")
                replay.add(handle)
                if frames < args.learning_starts:
                    continue
                owed += handle.frames * args.gradient_steps_per_frame
                if args.anneal_lr:
                    for group in optimizer.param_groups:
                        group["lr"] = args.learning_rate * (1.0 - frames / args.total_frames)
                losses = []
                while owed >= 1:
                    losses.append(td_step(q, target, optimizer, replay.sample(args.batch_size),
                                          args))
                    owed -= 1
                    gradient_steps += 1
                    if gradient_steps % args.target_update_interval == 0:
                        target.load_state_dict(q.state_dict())
                fraction = min(1.0, frames / args.exploration_frames)
                epsilon = args.start_epsilon + fraction * (args.end_epsilon - args.start_epsilon)
                q.epsilon.fill_(epsilon)
                collector.update_weights(q)
                s = collector.summary()
                sps = frames / (time.perf_counter() - start)
                if tb is not None and losses:  # the learner's figures, next to the collector's
                    tb.log_metrics({"losses/td_loss": float(np.mean(losses)),
                                    "charts/epsilon": epsilon,
                                    "charts/learning_rate": optimizer.param_groups[0]["lr"],
                                    "charts/gradient_steps": gradient_steps}, step=frames)
                metrics.log(frames, **{
                    "losses/td_loss": float(np.mean(losses)) if losses else float("nan"),
                    "charts/SPS": sps, "charts/epsilon": epsilon,
                    "charts/learning_rate": optimizer.param_groups[0]["lr"],
                    "charts/gradient_steps": gradient_steps,
                    "collector/policy_lag": handle.policy_lag,
                    "collector/policy_lag_mean": s["policy_lag_mean"],
                    "collector/dropped_stale": s["dropped_stale"],
                    "collector/fps": s["fps"],
                })
                bar.set_postfix(ret=f"{np.mean(recent) if recent else float('nan'):.1f}",
                                lag=handle.policy_lag, sps=f"{sps:.0f}")
            summary = collector.summary()
    finally:
        metrics.close()
        if client is not None:
            client.close()
    elapsed = time.perf_counter() - start
    result = {
        "frames": summary["frames"],
        "seconds": elapsed,
        "sps": summary["frames"] / elapsed,
        "episodes": summary["episodes"],
        "gradient_steps": gradient_steps,
        "mean_return_last_window": float(np.mean(recent)) if recent else float("nan"),
        "frames_to_target": reached_at,
        "policy_lag_mean": summary["policy_lag_mean"],
        "policy_lag_max": summary["policy_lag_max"],
        "policy_lag_counts": summary["policy_lag_counts"],
        "dropped_stale": summary["dropped_stale"],
        "worker_rollout_fps": [w["rollout_fps"] for w in summary["workers"].values()],
    }
    (run_dir / "result.json").write_text(json.dumps(result, indent=1))
    if args.plot and curve_returns:
        save_curve(run_dir / "curve.png", curve_frames, curve_returns, args.window,
                   args.target_return, f"DQN {args.env_id}, daskrl async, {args.num_workers} workers")
    print(f"frames: {result['frames']}  time: {elapsed:.1f}s  SPS: {result['sps']:.0f}  "
          f"episodes: {result['episodes']}  gradient steps: {gradient_steps}")
    print(f"policy lag: mean {result['policy_lag_mean']:.2f}, max {result['policy_lag_max']}, "
          f"batches by lag {result['policy_lag_counts']}, dropped as stale "
          f"{result['dropped_stale']}")
    print(f"mean return of the last {args.window} episodes: {result['mean_return_last_window']:.1f}")
    if reached_at is None:
        print(f"target {args.target_return:g} not reached")
    else:
        print(f"target {args.target_return:g} reached at {reached_at} frames")
    print(f"run dir: {run_dir}")
    return result


if __name__ == "__main__":
    main(parse_args())
