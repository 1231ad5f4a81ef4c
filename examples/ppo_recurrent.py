"""PPO with a GRU actor-critic on CartPole with its velocities masked, collected by daskrl.

The envs show only the cart's position and the pole's angle (``[x, theta]``): without the
velocities one observation does not tell where the pole is going, so the task is partially
observable, and a policy needs memory to balance the pole. The GRU's state is that memory:
the workers carry it per env from step to step and batch to batch (resetting it where an
episode starts) and store with each batch the state it started from (``policy_state``) and
where episodes start (``is_init``). The learner replays each batch from that state, truncated
backpropagation through time over the batch's steps, so its PPO ratios compare the same
computation the workers made.

``--no-recurrent`` runs the same PPO with ``ppo_cartpole.py``'s MLP on the same masked
observations: the baseline without memory.

Run::

    python examples/ppo_recurrent.py                    # 300k frames on 2 local workers
    python examples/ppo_recurrent.py --no-recurrent     # the MLP, same observations
    python examples/ppo_recurrent.py --help

Metrics go to ``<run dir>/metrics.jsonl``, the learning curve to ``<run dir>/curve.png`` and
the summary to ``<run dir>/result.json``, as in ``ppo_cartpole.py``.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import time
import typing
from pathlib import Path

import cloudpickle
import gymnasium as gym
import numpy as np
import ppo_cartpole
import torch
from ppo_cartpole import Agent, MetricsLog, gae, layer_init, parse_args, ppo_update, save_curve
from torch import nn
from tqdm import tqdm

import daskrl

# The MLP and the helpers come from ppo_cartpole.py beside this file, which workers started
# elsewhere (``--scheduler``) cannot import: send its code with the policy, as this file's is.
cloudpickle.register_pickle_by_value(ppo_cartpole)

VISIBLE = (0, 2)
"""The entries of CartPole's observation the envs show: cart position and pole angle."""


@dataclasses.dataclass
class Args:
    recurrent: bool = True
    """the GRU actor-critic (--no-recurrent: ppo_cartpole.py's MLP on the same observations)"""
    total_frames: int = 300_000
    """frames (env steps) to collect in all"""
    num_workers: int = 2
    """Dask workers collecting in parallel (one batch each per round)"""
    envs_per_worker: int = 16
    """envs each worker steps together"""
    steps_per_batch: int = 32
    """steps of each env per batch, and the length of the learner's backpropagation through time"""
    hidden: int = 64
    """the GRU's state size"""
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
    minibatch_envs: int = 4
    """env columns (whole sequences of steps_per_batch steps) per gradient step"""
    minibatch_size: int = 128
    """frames per gradient step of the MLP (--no-recurrent)"""
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
    """where the store, metrics.jsonl and curve.png go (default: runs/ppo_recurrent__<seed>__<time>)"""
    scheduler: str = ""
    """address of a running Dask scheduler (default: an embedded LocalCluster of num_workers)"""
    plot: bool = True
    """save the learning curve as <run dir>/curve.png (needs matplotlib)"""
    progress: bool = True
    """show a progress bar"""
    torch_threads: int = 1
    """torch threads of the learner"""


def masked_cartpole() -> gym.Env:
    """``CartPole-v1`` showing only ``[x, theta]`` (a factory: workers build the envs)."""
    env = gym.make("CartPole-v1")
    space = gym.spaces.Box(-np.inf, np.inf, (len(VISIBLE),), np.float32)
    return gym.wrappers.TransformObservation(
        env, lambda obs: obs[list(VISIBLE)].astype(np.float32), space)


class GRUAgent(nn.Module):
    """An encoder, a GRU cell and the actor and critic heads on its state.

    ``forward(obs, state)`` is what the workers run: a sampled action and its log-probability,
    stored with every step, and the new state.
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.encoder = nn.Sequential(layer_init(nn.Linear(obs_dim, hidden)), nn.Tanh())
        self.gru = nn.GRUCell(hidden, hidden)
        for name, p in self.gru.named_parameters():
            nn.init.orthogonal_(p) if "weight" in name else nn.init.zeros_(p)
        self.actor = layer_init(nn.Linear(hidden, n_actions), std=0.01)
        self.critic = layer_init(nn.Linear(hidden, 1), std=1.0)

    def initial_state(self, num_envs: int) -> torch.Tensor:
        return torch.zeros(num_envs, self.hidden, device=self.actor.weight.device)

    def step(self, obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return self.gru(self.encoder(obs.float()), state)

    def forward(self, obs: torch.Tensor,
                state: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        state = self.step(obs, state)
        dist = torch.distributions.Categorical(logits=self.actor(state))
        action = dist.sample()
        return {"action": action, "log_prob": dist.log_prob(action)}, state


def unroll(agent: GRUAgent, batch: dict[str, torch.Tensor], cols: torch.Tensor,
           successors: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Replay env columns ``cols`` of a batch from its stored ``policy_state``: the logits and
    values of every step ``[T, n]``, and with ``successors`` the values of every step's
    ``next_observation`` (else None).

    The state is reset to the initial one where ``is_init`` says an episode starts, as the
    workers did, so the logits equal the ones the workers sampled from (before an update).
    """
    obs, nxt, is_init = (batch[k][:, cols] for k in ("observation", "next_observation",
                                                     "is_init"))
    state = batch["policy_state"][cols]
    initial = agent.initial_state(len(cols))
    logits, values, next_values = [], [], []
    for t in range(obs.shape[0]):
        state = torch.where(is_init[t, :, None], initial, state)
        state = agent.step(obs[t], state)
        logits.append(agent.actor(state))
        values.append(agent.critic(state).squeeze(-1))
        if successors:  # one more step of the state on next_observation (the final
            # observation where the episode ended), which equals the next row's unless it did
            next_values.append(agent.critic(agent.step(nxt[t], state)).squeeze(-1))
    return (torch.stack(logits), torch.stack(values),
            torch.stack(next_values) if successors else None)


def recurrent_ppo_update(agent: GRUAgent, optimizer: torch.optim.Optimizer,
                         batches: list[dict[str, torch.Tensor]], args: Args) -> dict[str, float]:
    """PPO epochs over one round's batches, in minibatches of whole env columns, each replayed
    from the batch's ``policy_state`` (truncated BPTT over ``T`` steps)."""
    every = torch.arange(batches[0]["observation"].shape[1])
    stats: dict[str, list[float]] = collections.defaultdict(list)
    with torch.no_grad():
        for b in batches:
            logits, value, next_value = unroll(agent, b, every, successors=True)
            assert next_value is not None
            b["advantage"], b["return"] = gae(b, value, next_value, args.gamma, args.gae_lambda)
            # the weights the workers sampled with, replayed from the stored state: the same
            # log-probabilities, or the stored state and resets do not say what they ran
            replayed = torch.distributions.Categorical(logits=logits).log_prob(b["action"])
            stats["replay/max_log_prob_error"].append(
                (replayed - b["log_prob"]).abs().max().item())
    for _ in range(args.update_epochs):
        for b in batches:
            for cols in torch.randperm(len(every)).split(args.minibatch_envs):
                logits, value, _ = unroll(agent, b, cols)
                dist = torch.distributions.Categorical(logits=logits)
                log_ratio = dist.log_prob(b["action"][:, cols]) - b["log_prob"][:, cols]
                ratio = log_ratio.exp()
                adv = b["advantage"][:, cols]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(
                    1 - args.clip_coef, 1 + args.clip_coef)).mean()
                v_loss = 0.5 * (value - b["return"][:, cols]).pow(2).mean()
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
    out = {k: float(np.mean(v)) for k, v in stats.items()}
    out["replay/max_log_prob_error"] = max(stats["replay/max_log_prob_error"])
    return out


def main(args: Args) -> dict[str, typing.Any]:
    kind = "gru" if args.recurrent else "mlp"
    run_dir = Path(args.run_dir or f"runs/ppo_recurrent_{kind}__{args.seed}__{int(time.time())}")
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.torch_threads)
    torch.manual_seed(args.seed)
    agent: nn.Module = (GRUAgent(len(VISIBLE), 2, args.hidden) if args.recurrent
                        else Agent(len(VISIBLE), 2))
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    client = None
    if args.scheduler:
        from distributed import Client

        client = Client(args.scheduler, set_as_default=False)
    metrics = MetricsLog(run_dir / "metrics.jsonl")
    keys = ["observation", "next_observation", "action", "log_prob", "reward", "terminated",
            "truncated"] + (["policy_state", "is_init"] if args.recurrent else [])
    curve_frames: list[int] = []
    curve_returns: list[float] = []
    recent: collections.deque[float] = collections.deque(maxlen=args.window)
    reached_at = reached_seconds = None
    start = time.perf_counter()
    try:
        with daskrl.Collector(
            masked_cartpole, agent, str(run_dir / "store"), client=client, rounds=True,
            num_workers=args.num_workers, envs_per_worker=args.envs_per_worker,
            frames_per_batch=args.envs_per_worker * args.steps_per_batch,
            total_frames=args.total_frames, seed=args.seed,
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
                        reached_at, reached_seconds = frames, time.perf_counter() - start
                        bar.write(f"reached a mean return of {np.mean(recent):.1f} over the last "
                                  f"{args.window} episodes at {frames} frames")
                round_.append(handle)
                if collector.in_flight:  # the round's other batches are still coming
                    continue
                batches = [h.load(keys=keys) for h in round_]  # each [T, E, ...]
                lr = args.learning_rate * (1.0 - frames / args.total_frames)
                for group in optimizer.param_groups:
                    group["lr"] = max(lr, 1e-6)
                if isinstance(agent, GRUAgent):
                    losses = recurrent_ppo_update(agent, optimizer, batches, args)
                else:
                    losses = ppo_update(agent, optimizer, batches, args)  # type: ignore[arg-type]
                collector.update_weights(agent)
                round_.clear()
                sps = frames / (time.perf_counter() - start)
                metrics.log(frames, **losses, **{"charts/SPS": sps, "charts/learning_rate": lr})
                bar.set_postfix(ret=f"{np.mean(recent) if recent else float('nan'):.1f}",
                                sps=f"{sps:.0f}")
            summary = collector.summary()
    finally:
        metrics.close()
        if client is not None:
            client.close()
    elapsed = time.perf_counter() - start
    result = {
        "policy": kind,
        "frames": summary["frames"],
        "seconds": elapsed,
        "sps": summary["frames"] / elapsed,
        "episodes": summary["episodes"],
        "mean_return_last_window": float(np.mean(recent)) if recent else float("nan"),
        "best_mean_return": _best_running_mean(curve_returns, args.window),
        "frames_to_target": reached_at,
        "seconds_to_target": reached_seconds,
    }
    (run_dir / "result.json").write_text(json.dumps(result, indent=1))
    if args.plot and curve_returns:
        save_curve(run_dir / "curve.png", curve_frames, curve_returns, args.window,
                   args.target_return, f"PPO ({kind.upper()}) on CartPole-v1 without velocities")
    print(f"frames: {result['frames']}  time: {elapsed:.1f}s  SPS: {result['sps']:.0f}  "
          f"episodes: {result['episodes']}")
    print(f"mean return of the last {args.window} episodes: {result['mean_return_last_window']:.1f}"
          f" (best {result['best_mean_return']:.1f})")
    if reached_at is None:
        print(f"target {args.target_return:g} not reached")
    else:
        print(f"target {args.target_return:g} reached at {reached_at} frames "
              f"({reached_seconds:.1f} s)")
    print(f"run dir: {run_dir}")
    return result


def _best_running_mean(returns: list[float], window: int) -> float:
    if len(returns) < window:
        return float(np.mean(returns)) if returns else float("nan")
    return float(np.convolve(returns, np.ones(window) / window, mode="valid").max())


if __name__ == "__main__":
    main(parse_args(Args, __doc__))
