"""The learner's CPU per handle: handles fetched through the scheduler, or from the workers.

A Dask client outside the cluster fetches a result by asking the scheduler, which fetches it
from the worker and passes it on (``direct_to_workers=None``, Dask's default, what daskrl's
learner does); a client that may reach the workers can ask the worker itself
(``direct_to_workers=True``). Measured four times on two workers (``benchmarks/results/
learner-cpu-s26-fetch-*.txt``), the direct fetch's CPU per handle was 0.92-1.03 of the
relayed one's: no difference the runs resolve, so daskrl keeps Dask's default.

(A sync round submitted as one graph, one update-graph message per round, was measured with
this benchmark's counting too, and reverted: ``benchmarks/results/learner-cpu-s26-round-sync.txt``,
the learner's CPU per handle 4.48 ms with a graph per task, 4.88 ms with a graph per round
of 2: building a delayed graph on the client and the scheduler's ordering pass cost more than
the one update-graph saved.)

On the embedded cluster the scheduler and the nannies run in the learner's process, so both
are the learner's CPU. One embedded cluster of ``--workers`` workers; greedy CartPole
(``bench_collect``'s workload: 8 envs per worker, 4096-frame batches, the same weights),
``--batches`` per run after 4 untimed ones, the two variants alternated ``--repeats`` times.
Printed: the learner process's CPU per handle (``time.process_time``, every thread: client,
scheduler, nannies), frames/s, and the scheduler's update-graph messages per batch, as
medians, and the ratios.

Run:  python benchmarks/bench_learner_cpu.py [--workers 2] [--repeats 4] [--sync]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator

import gymnasium as gym
import torch
from bench_collect import ENVS_PER_WORKER, FRAMES_PER_BATCH, make_policy
from distributed import Client

import daskrl
from daskrl.deploy import local_cluster

LABELS = ("through the scheduler", "from the workers")


@contextlib.contextmanager
def counting_graphs(scheduler) -> Iterator[list[int]]:
    """Counts the scheduler's update-graph messages while open."""
    original = scheduler.stream_handlers["update-graph"]
    count = [0]

    async def counted(*args, **kwargs):
        count[0] += 1
        return await original(*args, **kwargs)

    scheduler.stream_handlers["update-graph"] = counted
    try:
        yield count
    finally:
        scheduler.stream_handlers["update-graph"] = original


def run(cluster, direct: bool, policy: torch.nn.Module, batches: int,
        sync: bool) -> tuple[float, float, float]:
    """``(learner CPU ms per handle, frames/s, update-graphs per batch)`` of one collection."""
    store = tempfile.mkdtemp(prefix="daskrl-learner-cpu-")
    try:
        with (Client(cluster, set_as_default=False, direct_to_workers=direct or None) as client,
              daskrl.Collector("CartPole-v1", policy, store, client=client,
                               envs_per_worker=ENVS_PER_WORKER,
                               frames_per_batch=FRAMES_PER_BATCH,
                               total_frames=FRAMES_PER_BATCH * (batches + 4), rounds=sync) as c):
            it = iter(c)
            for _ in range(4):
                next(it)
            with counting_graphs(cluster.scheduler) as graphs:
                c0, t0 = time.process_time(), time.perf_counter()
                n = sum(1 for _ in it)
                c1, t1 = time.process_time(), time.perf_counter()
    finally:
        shutil.rmtree(store, ignore_errors=True)
    return (c1 - c0) / n * 1e3, n * FRAMES_PER_BATCH / (t1 - t0), graphs[0] / n


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
    labels = LABELS
    got: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
    with local_cluster(args.workers) as cluster:
        for r in range(args.repeats):
            for new in (False, True):
                got[new].append(run(cluster, new, policy, args.batches, args.sync))
                cpu, fps, graphs = got[new][-1]
                print(f"  repeat {r} {labels[new]}: {cpu:.2f} ms/handle, {fps:,.0f} frames/s, "
                      f"{graphs:.2f} update-graphs/batch", flush=True)
    med = {n: tuple(statistics.median(x[i] for x in v) for i in range(3)) for n, v in got.items()}
    mode = "sync" if args.sync else "async"
    print(f"\n{args.workers} workers, {mode}, greedy CartPole, {args.repeats} repeats (medians):")
    print(f"{'':>22s} {'learner CPU ms/handle':>22s} {'frames/s':>10s} {'update-graphs/batch':>20s}")
    for new in (False, True):
        print(f"{labels[new]:>22s} {med[new][0]:22.2f} {med[new][1]:10,.0f} {med[new][2]:20.2f}")
    print(f"{labels[True]} / {labels[False]}: CPU per handle {med[True][0] / med[False][0]:.2f}, "
          f"frames/s {med[True][1] / med[False][1]:.2f}")


if __name__ == "__main__":
    main()
