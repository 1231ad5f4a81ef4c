"""The learner's CPU per handle: handles fetched through the scheduler, or from the workers.

A Dask client outside the cluster fetches a result by asking the scheduler, which fetches it
from the worker and passes it on (``direct_to_workers=None``, Dask's default); a client that
may reach the workers asks the worker itself (``direct_to_workers=True``, what the embedded
cluster's learner does: ``daskrl.deploy.local_client``). On the embedded cluster the scheduler
runs on the learner's event loop, so the relay is the learner's CPU.

One embedded cluster of ``--workers`` workers; greedy CartPole (``bench_collect``'s workload:
8 envs per worker, 4096-frame batches, the same weights), ``--batches`` per run after 4 untimed
ones, the two clients alternated ``--repeats`` times. Printed: the learner process's CPU per
handle (``time.process_time``: client, scheduler and nannies, every thread) and frames/s, as
medians, and their ratios.

Run:  python benchmarks/bench_handle_fetch.py [--workers 2] [--repeats 4] [--sync]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time

import gymnasium as gym
import torch
from bench_collect import ENVS_PER_WORKER, FRAMES_PER_BATCH, make_policy
from distributed import Client

import daskrl
from daskrl.deploy import local_cluster


def run(cluster, direct: bool, policy: torch.nn.Module, batches: int,
        sync: bool) -> tuple[float, float]:
    """``(learner CPU ms per handle, frames/s)`` of one collection."""
    store = tempfile.mkdtemp(prefix="daskrl-fetch-")
    try:
        with (Client(cluster, set_as_default=False, direct_to_workers=direct or None) as client,
              daskrl.Collector("CartPole-v1", policy, store, client=client,
                               envs_per_worker=ENVS_PER_WORKER,
                               frames_per_batch=FRAMES_PER_BATCH,
                               total_frames=FRAMES_PER_BATCH * (batches + 4), sync=sync) as c):
            it = iter(c)
            for _ in range(4):
                next(it)
            c0, t0 = time.process_time(), time.perf_counter()
            n = sum(1 for _ in it)
            c1, t1 = time.process_time(), time.perf_counter()
    finally:
        shutil.rmtree(store, ignore_errors=True)
    return (c1 - c0) / n * 1e3, n * FRAMES_PER_BATCH / (t1 - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--sync", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    env = gym.make("CartPole-v1")
    policy = make_policy("greedy", env.observation_space, env.action_space)
    got: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    with local_cluster(args.workers) as cluster:
        for r in range(args.repeats):
            for direct in (False, True):
                got[direct].append(run(cluster, direct, policy, args.batches, args.sync))
                cpu, fps = got[direct][-1]
                print(f"  repeat {r} {'direct' if direct else 'relayed'}: {cpu:.2f} ms/handle, "
                      f"{fps:,.0f} frames/s", flush=True)
    med = {d: (statistics.median(c for c, _ in v), statistics.median(f for _, f in v))
           for d, v in got.items()}
    mode = "sync" if args.sync else "async"
    print(f"\n{args.workers} workers, {mode}, greedy CartPole, {args.repeats} repeats (medians):")
    print(f"{'fetch':>22s} {'learner CPU ms/handle':>22s} {'frames/s':>10s}")
    for d, label in ((False, "through the scheduler"), (True, "from the workers")):
        print(f"{label:>22s} {med[d][0]:22.2f} {med[d][1]:10,.0f}")
    print(f"direct/relayed: CPU per handle {med[True][0] / med[False][0]:.2f}, "
          f"frames/s {med[True][1] / med[False][1]:.2f}")


if __name__ == "__main__":
    main()
