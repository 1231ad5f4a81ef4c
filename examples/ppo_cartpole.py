"""PPO on CartPole-v1, on-policy, with daskrl collecting on Dask workers.

Every round, each worker collects one batch of ``envs_per_worker`` envs x ``steps_per_batch``
steps with the current weights (``rounds=True``: the whole round uses one weights version); the
learner loads the round's batches from the store, runs PPO epochs on them, and publishes the new
weights for the next round. Episodes continue across batches, so advantages bootstrap from
``V(next_observation)`` at a batch's end, and only ``terminated`` (not ``truncated``) cuts the
bootstrap.

Run::

    python examples/ppo_cartpole.py                     # 300k frames on 2 local workers
    python examples/ppo_cartpole.py --help

Metrics go to ``<run dir>/metrics.jsonl`` under cleanrl's namespaced keys (``charts/SPS``,
``charts/episodic_return``, ``losses/...``) plus daskrl's collector figures (``collector/...``);
``--tensorboard DIR`` also logs them to TensorBoard (the collector's through
``daskrl.loggers.TensorBoardLogger``, the losses through the same logger); the learning curve is
saved as ``<run dir>/curve.png`` (``pip install "daskrl[examples]"``).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import time
import typing
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from tqdm import tqdm

import daskrl
from daskrl.loggers import TensorBoardLogger


@dataclasses.dataclass
class Args:
    env_id: str = "CartPole-v1"
    """the gymnasium id of the environment"""
    total_frames: int = 300_000
    """frames (env steps) to collect in all"""
    num_workers: int = 2
    """Dask workers collecting in parallel (one batch each per round)"""
    envs_per_worker: int = 8
    """envs each worker steps together"""
    steps_per_batch: int = 32
    """steps of each env per batch: a round is num_workers * envs_per_worker * steps frames"""
    seed: int = 1
    """seed of the learner's torch and of the collector's envs and policy sampling"""
    learning_rate: float = 1e-3
    """Adam's learning rate, annealed linearly to 0 over the run"""
    gamma: float = 0.98
    """discount"""
    gae_lambda: float = 0.8
    """lambda of generalized advantage estimation"""
    update_epochs: int = 10
    """passes over each round's data"""
    minibatch_size: int = 128
    """frames per gradient step"""
    clip_coef: float = 0.2
    """PPO's surrogate clipping"""
    ent_coef: float = 0.0
    """entropy bonus"""
    vf_coef: float = 0.5
    """value loss weight"""
    max_grad_norm: float = 0.5
    """gradient clipping"""
    target_return: float = 475.0
    """report the frames at which the mean return of the last `window` episodes reaches this"""
    window: int = 20
    """episodes in the running mean compared with target_return"""
    run_dir: str = ""
    """where the store, metrics.jsonl and curve.png go (default: runs/ppo_cartpole__<seed>__<time>)"""
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


def parse_args(fields: type = Args, doc: str | None = __doc__) -> typing.Any:
    """Command-line flags from the fields of the dataclass ``fields`` (``--total-frames
    1000`` ...), described by the first paragraph of ``doc``; an instance of ``fields``."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    hints = typing.get_type_hints(fields)
    for f in dataclasses.fields(fields):
        flag = "--" + f.name.replace("_", "-")
        if hints[f.name] is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        else:
            parser.add_argument(flag, type=hints[f.name], default=f.default)
    return fields(**vars(parser.parse_args()))


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


class Agent(nn.Module):
    """Actor and critic MLPs. ``forward`` is what the workers run: a sampled action and its
    log-probability, stored with every step."""

    def __init__(self, obs_dim: int, n_actions: int) -> None:
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, n_actions), std=0.01),
        )

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def dist(self, obs: torch.Tensor) -> torch.distributions.Categorical:
        return torch.distributions.Categorical(logits=self.actor(obs))

    def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        dist = self.dist(obs.float())
        action = dist.sample()
        return {"action": action, "log_prob": dist.log_prob(action)}


def advantages(agent: Agent, data: dict[str, torch.Tensor], gamma: float,
               lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over time-major ``[T, N]`` data whose episodes may span batches.

    ``next_observation`` is the true successor (the final observation at an episode's end),
    so each step bootstraps from ``V(next_observation)`` unless the episode *terminated*; the
    lambda-recursion stops at any episode end (terminated or truncated) and at the batch end.
    """
    with torch.no_grad():
        value = agent.value(data["observation"])
        next_value = agent.value(data["next_observation"])
    return gae(data, value, next_value, gamma, lam)


def gae(data: dict[str, torch.Tensor], value: torch.Tensor, next_value: torch.Tensor,
        gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantages and returns over ``[T, N]`` steps from their values and their
    successors' values: bootstrapped unless the episode terminated; the recursion stops at any
    episode end and at the batch end."""
    terminated = data["terminated"].float()
    done = (data["terminated"] | data["truncated"]).float()
    delta = data["reward"] + gamma * next_value * (1.0 - terminated) - value
    adv = torch.zeros_like(delta)
    last = torch.zeros_like(delta[0])
    for t in reversed(range(delta.shape[0])):
        last = delta[t] + gamma * lam * (1.0 - done[t]) * last
        adv[t] = last
    return adv, adv + value


def ppo_update(agent: Agent, optimizer: torch.optim.Optimizer,
               batches: list[dict[str, torch.Tensor]], args: Args) -> dict[str, float]:
    """PPO epochs over one round's batches (each ``[T, E]``); returns the mean losses."""
    advs, rets = zip(*(advantages(agent, b, args.gamma, args.gae_lambda) for b in batches))
    obs = torch.cat([b["observation"].flatten(0, 1) for b in batches])
    act = torch.cat([b["action"].flatten(0, 1) for b in batches])
    old_logp = torch.cat([b["log_prob"].flatten(0, 1) for b in batches])
    adv = torch.cat([a.flatten() for a in advs])
    ret = torch.cat([r.flatten() for r in rets])
    n = obs.shape[0]
    stats: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(args.update_epochs):
        for idx in torch.randperm(n).split(args.minibatch_size):
            dist = agent.dist(obs[idx])
            logp = dist.log_prob(act[idx])
            log_ratio = logp - old_logp[idx]
            ratio = log_ratio.exp()
            mb_adv = adv[idx]
            mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
            pg_loss = torch.max(-mb_adv * ratio,
                                -mb_adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()
            v_loss = 0.5 * (agent.value(obs[idx]) - ret[idx]).pow(2).mean()
            entropy = dist.entropy().mean()
            loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()
            with torch.no_grad():
                stats["losses/policy_loss"].append(pg_loss.item())
                stats["losses/value_loss"].append(v_loss.item())
                stats["losses/entropy"].append(entropy.item())
                stats["losses/approx_kl"].append(((ratio - 1) - log_ratio).mean().item())
                stats["losses/clipfrac"].append(
                    ((ratio - 1.0).abs() > args.clip_coef).float().mean().item())
    return {k: float(np.mean(v)) for k, v in stats.items()}


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


def main(args: Args) -> dict[str, float]:
    run_dir = Path(args.run_dir or f"runs/ppo_cartpole__{args.seed}__{int(time.time())}")
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.torch_threads)
    torch.manual_seed(args.seed)
    probe = gym.make(args.env_id)
    agent = Agent(int(np.prod(probe.observation_space.shape)), int(probe.action_space.n))
    probe.close()
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    client = None
    if args.scheduler:
        from distributed import Client

        client = Client(args.scheduler, set_as_default=False)
    metrics = MetricsLog(run_dir / "metrics.jsonl")
    # The collector logs its metrics to TensorBoard itself (and closes the logger with it).
    tb = TensorBoardLogger(args.tensorboard) if args.tensorboard else None
    frames_per_batch = args.envs_per_worker * args.steps_per_batch
    curve_frames: list[int] = []
    curve_returns: list[float] = []
    recent: collections.deque[float] = collections.deque(maxlen=args.window)
    reached_at = None
    keys = ["observation", "next_observation", "action", "log_prob", "reward", "terminated",
            "truncated"]
    start = time.perf_counter()
    try:
        with daskrl.Collector(
            args.env_id, agent, str(run_dir / "store"), client=client, rounds=True,
            num_workers=args.num_workers, envs_per_worker=args.envs_per_worker,
            frames_per_batch=frames_per_batch, total_frames=args.total_frames, seed=args.seed,
            loggers=[tb] if tb is not None else [],
        ) as collector, tqdm(total=args.total_frames, unit="frame", disable=not args.progress,
                             dynamic_ncols=True) as bar:
            round_: list[daskrl.BatchHandle] = []
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
                round_.append(handle)
                if collector.in_flight:  # the round's other batches are still coming
                    continue
                # The whole round (one weights version) is in: learn on it, on-policy.
                assert all(h.weights_version == collector.weights_version for h in round_)
                batches = [h.load(keys=keys) for h in round_]  # each [T, E, ...]
                lr = args.learning_rate * (1.0 - frames / args.total_frames)
                for group in optimizer.param_groups:
                    group["lr"] = max(lr, 1e-6)
                losses = ppo_update(agent, optimizer, batches, args)
                collector.update_weights(agent)
                round_.clear()
                s = collector.summary()
                sps = frames / (time.perf_counter() - start)
                if tb is not None:  # the learner's figures, next to the collector's
                    tb.log_metrics({**losses, "charts/learning_rate": lr}, step=frames)
                metrics.log(frames, **losses, **{
                    "charts/SPS": sps, "charts/learning_rate": lr,
                    "collector/fps": s["fps"], "collector/policy_lag_mean": s["policy_lag_mean"],
                    "collector/episodes": s["episodes"],
                    **{f"collector/worker_rollout_fps/{i}": w["rollout_fps"]
                       for i, w in enumerate(s["workers"].values())},
                })
                bar.set_postfix(ret=f"{np.mean(recent) if recent else float('nan'):.1f}",
                                sps=f"{sps:.0f}")
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
        "mean_return_last_window": float(np.mean(recent)) if recent else float("nan"),
        "frames_to_target": reached_at,
        "worker_rollout_fps": [w["rollout_fps"] for w in summary["workers"].values()],
    }
    (run_dir / "result.json").write_text(json.dumps(result, indent=1))
    if args.plot and curve_returns:
        save_curve(run_dir / "curve.png", curve_frames, curve_returns, args.window,
                   args.target_return, f"PPO {args.env_id}, daskrl sync, {args.num_workers} workers")
    print(f"frames: {result['frames']}  time: {elapsed:.1f}s  SPS: {result['sps']:.0f}  "
          f"episodes: {result['episodes']}")
    print(f"mean return of the last {args.window} episodes: {result['mean_return_last_window']:.1f}")
    if reached_at is None:
        print(f"target {args.target_return:g} not reached")
    else:
        print(f"target {args.target_return:g} reached at {reached_at} frames")
    print(f"run dir: {run_dir}")
    return result


if __name__ == "__main__":
    main(parse_args())
