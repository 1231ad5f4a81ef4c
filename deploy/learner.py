"""A daskrl learner that runs unchanged on this machine, on SLURM, or on any Dask cluster.

Only where the workers come from changes::

    python deploy/learner.py --store runs/try                     # embedded LocalCluster
    python deploy/learner.py --scheduler-file /fsx/$USER/daskrl/scheduler.json \\
        --store /fsx/$USER/daskrl/runs/run-1                            # sbatch-started cluster
    python deploy/learner.py --cluster slurm --workers 8 \\
        --jobqueue-config deploy/slurm/jobqueue.yaml --store /fsx/$USER/runs/run-2

It collects CartPole experience and takes a REINFORCE step on each batch, publishing the new
weights to the workers. The store must be a path (or URL) that the workers and the learner
both see: on a cluster, the shared filesystem.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import torch
from distributed import Client

import daskrl
from daskrl.deploy import connect, tls_security
from daskrl.policies import MLPPolicy


def reinforce_step(policy: MLPPolicy, optimizer: torch.optim.Optimizer,
                   batch: dict[str, torch.Tensor], gamma: float = 0.99) -> float:
    """One policy-gradient step on a ``[T, E]`` batch (discounted returns within the batch)."""
    reward, done = batch["reward"], batch["terminated"] | batch["truncated"]
    returns = torch.zeros_like(reward)
    running = torch.zeros_like(reward[0])
    for t in reversed(range(reward.shape[0])):
        running = reward[t] + gamma * running * (~done[t]).float()
        returns[t] = running
    advantage = (returns - returns.mean()) / (returns.std() + 1e-8)
    logits = policy.net(batch["observation"].flatten(2).float())
    log_prob = torch.distributions.Categorical(logits=logits).log_prob(batch["action"])
    loss = -(log_prob * advantage).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()  # float(loss) warns: a tensor that requires grad


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store", required=True, help="path/URL that workers and learner share")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--cluster", default="local",
                       help="local, slurm, or a scheduler address (tcp://... or tls://...)")
    where.add_argument("--scheduler-file", default=None)
    p.add_argument("--workers", type=int, default=None, help="local or slurm: cluster size")
    p.add_argument("--jobqueue-config", default=None, help="slurm: dask config YAML")
    p.add_argument("--tls-ca-file")
    p.add_argument("--tls-cert")
    p.add_argument("--tls-key")
    p.add_argument("--wait-for-workers", type=int, default=1,
                   help="start once this many workers have joined (queued jobs take time)")
    p.add_argument("--frames", type=int, default=200_000)
    p.add_argument("--frames-per-batch", type=int, default=4096)
    p.add_argument("--envs-per-worker", type=int, default=8)
    args = p.parse_args(argv)

    security = (tls_security(args.tls_ca_file, args.tls_cert, args.tls_key)
                if args.tls_ca_file else None)
    sizing = {"workers": args.workers} if args.cluster in ("local", "slurm") else {}
    if args.cluster == "slurm":
        sizing["jobqueue_config"] = args.jobqueue_config
    with connect(args.cluster, scheduler_file=args.scheduler_file, security=security,
                 **sizing) as deployment:
        # On SLURM this stops early, with the job's log, when a worker job fails.
        deployment.wait_for_workers(args.wait_for_workers, timeout=3600)
        train(deployment.client, args.store, args.frames, args.frames_per_batch,
              args.envs_per_worker)
    print(f"done: {daskrl.open_store(args.store).frames} frames in {args.store}")


def train(client: Client, store: str, frames: int, frames_per_batch: int = 4096,
          envs_per_worker: int = 8) -> None:
    """Collect ``frames`` CartPole frames into ``store`` on ``client``'s workers, learning."""
    env = gym.make("CartPole-v1")
    policy = MLPPolicy(env.observation_space, env.action_space)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
    with daskrl.Collector("CartPole-v1", policy, store, client=client,
                          envs_per_worker=envs_per_worker, frames_per_batch=frames_per_batch,
                          total_frames=frames) as collector:
        start = time.perf_counter()
        for handle in collector:
            loss = reinforce_step(policy, optimizer, handle.load())
            version = collector.update_weights(policy)
            s = collector.summary()
            print(f"batch {handle.batch_id} from {handle.worker} ({handle.device}): "
                  f"loss {loss:.3f}, weights v{version}, mean return {s['mean_return']:.1f}, "
                  f"{s['frames']} frames in {time.perf_counter() - start:.0f}s", flush=True)


if __name__ == "__main__":  # required: the embedded cluster's workers are spawned processes
    main()
