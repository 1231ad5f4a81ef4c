"""On-policy PPO end to end: ``examples/ppo_cartpole.py`` against a single-process loop.

Both run the example's own PPO (its ``Agent``, ``advantages`` and ``ppo_update``: the same
math, the same settings) on CartPole-v1 from the same seed; only the collection differs:

* ``single process``: cleanrl's shape of loop: ``num_workers x envs_per_worker`` envs in one
  ``SyncVectorEnv`` (same-step autoreset, as daskrl's envs), the agent sampling under
  ``torch.inference_mode()``, ``steps_per_batch`` steps a round into preallocated tensors, then
  the update, in this process, one torch thread;
* ``daskrl``: the example's ``main``: a ``Collector(rounds=True)`` on the embedded cluster of
  ``num_workers`` workers, each collecting ``envs_per_worker x steps_per_batch`` a round, the
  learner loading the round from the store.

A round is the same number of frames on both sides (16 envs x 32 steps by default). The runs
alternate, ``--repeats`` times; the table gives frames/s, the frames at which the mean return
of the last 20 episodes first reached 475, and the ratio daskrl/single with its range.

Run:  python benchmarks/bench_ppo.py [--total-frames 200000] [--json ppo.json]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import ppo_cartpole as ex  # noqa: E402


def single_process(args: ex.Args) -> dict[str, float]:
    """The example's PPO with its envs stepped in this process."""
    torch.set_num_threads(args.torch_threads)
    torch.manual_seed(args.seed)
    n_envs = args.num_workers * args.envs_per_worker
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make(args.env_id) for _ in range(n_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    agent = ex.Agent(obs_dim, int(envs.single_action_space.n))
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    t, shape = args.steps_per_batch, (args.steps_per_batch, n_envs)
    buf = {"observation": torch.zeros((*shape, obs_dim)),
           "next_observation": torch.zeros((*shape, obs_dim)),
           "action": torch.zeros(shape, dtype=torch.long), "log_prob": torch.zeros(shape),
           "reward": torch.zeros(shape), "terminated": torch.zeros(shape, dtype=torch.bool),
           "truncated": torch.zeros(shape, dtype=torch.bool)}
    recent: collections.deque[float] = collections.deque(maxlen=args.window)
    returns = np.zeros(n_envs)
    reached_at = None
    frames = 0
    start = time.perf_counter()
    obs, _ = envs.reset(seed=args.seed)
    while frames < args.total_frames:
        for step in range(t):
            o = torch.as_tensor(obs, dtype=torch.float32)
            with torch.inference_mode():
                out = agent(o)
            nxt, reward, term, trunc, info = envs.step(out["action"].numpy())
            done = term | trunc
            final = nxt.copy()
            if done.any():  # same-step autoreset: the true successor is the final observation
                final[done] = np.stack(info["final_obs"][done])
            buf["observation"][step] = o
            buf["next_observation"][step] = torch.as_tensor(final)
            buf["action"][step] = out["action"]
            buf["log_prob"][step] = out["log_prob"]
            buf["reward"][step] = torch.as_tensor(reward)
            buf["terminated"][step] = torch.as_tensor(term)
            buf["truncated"][step] = torch.as_tensor(trunc)
            returns += reward
            for i in np.flatnonzero(done):
                recent.append(returns[i])
                returns[i] = 0.0
                if (reached_at is None and len(recent) == args.window
                        and np.mean(recent) >= args.target_return):
                    reached_at = frames + (step + 1) * n_envs
            obs = nxt
        frames += t * n_envs
        for group in optimizer.param_groups:
            group["lr"] = max(args.learning_rate * (1.0 - frames / args.total_frames), 1e-6)
        ex.ppo_update(agent, optimizer, [dict(buf)], args)
    seconds = time.perf_counter() - start
    envs.close()
    return {"frames": frames, "seconds": seconds, "sps": frames / seconds,
            "mean_return_last_window": float(np.mean(recent)) if recent else float("nan"),
            "frames_to_target": reached_at}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--total-frames", type=int, default=200_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json")
    cli = p.parse_args()
    results: dict[str, list[dict[str, float]]] = {"single process": [], "daskrl": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(cli.repeats):
            args = ex.Args(total_frames=cli.total_frames, plot=False, progress=False,
                           run_dir=f"{tmp}/run{r}")
            results["single process"].append(single_process(args))
            results["daskrl"].append(
                {k: v for k, v in ex.main(dataclasses.replace(args)).items()
                 if k != "worker_rollout_fps"})
            for name, rs in results.items():
                print(f"repeat {r} {name:>14}: {rs[-1]['sps']:7.0f} frames/s, "
                      f"{rs[-1]['seconds']:6.1f} s, target at {rs[-1]['frames_to_target']}",
                      flush=True)
    ratios = [d["sps"] / s["sps"] for s, d in zip(results["single process"], results["daskrl"])]
    a = ex.Args()
    print(f"\nPPO CartPole-v1, {a.num_workers} x {a.envs_per_worker} envs x "
          f"{a.steps_per_batch} steps a round, {cli.total_frames} frames, seed {a.seed}")
    print(f"{'':>16} {'frames/s':>9} {'s':>7} {'frames to 475':>14}")
    for name, rs in results.items():
        print(f"{name:>16} {statistics.median(x['sps'] for x in rs):9.0f} "
              f"{statistics.median(x['seconds'] for x in rs):7.1f} "
              f"{', '.join(str(x['frames_to_target']) for x in rs):>14}")
    print(f"daskrl / single process: {statistics.median(ratios):.2f}x "
          f"(range {min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)} repeats)")
    if cli.json:
        Path(cli.json).write_text(json.dumps({"results": results, "ratios": ratios}, indent=1))


if __name__ == "__main__":
    main()
