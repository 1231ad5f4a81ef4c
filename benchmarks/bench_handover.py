"""The learner's cost per handle when tasks carry many batches (``batches_per_task``).

The scaling model (``docs/scaling.md``) splits the learner's CPU into a cost per Dask task and
a cost per handle, and asks for at most ~15 µs per handle once tasks carry hundreds of batches.
Two measurements:

1. **In process, side by side**: per handle, unpickling a task's result (``k`` distinct
   handles, 20 finished episodes each, as Dask delivers it) and ``HandOver.take`` (policy lag,
   statistics) as daskrl does it, against ``take`` with ``dataclasses.replace`` (the code
   before this benchmark's change), alternated ``--repeats`` times; medians.
2. **End to end**: one embedded cluster of ``--workers`` workers collecting greedy CartPole in
   small batches (``--frames-per-batch``, 8 envs per worker, async) with ``batches_per_task``
   ``k`` in ``--k``; the learner process's CPU (client, scheduler, nannies: all in it on the
   embedded cluster) per handle, for daskrl's iterator (a fetched handle is handed over in the
   learner's thread) against a loop that asks the event loop for every handle
   (``client.sync(run.next_handle)``, the iterator before this benchmark's change), alternated
   ``--repeats`` times; medians and their ratio.

Run:  python benchmarks/bench_handover.py [--workers 2] [--k 1 8 32 128] [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import pickle
import random
import shutil
import statistics
import tempfile
import time

import gymnasium as gym
import torch
from bench_collect import make_policy
from distributed import Client

import daskrl
from daskrl.collect._handover import HandOver
from daskrl.deploy import local_cluster
from daskrl.store._handles import BatchHandle


class ReplaceHandOver(HandOver):
    """``accept`` as before: ``dataclasses.replace`` for each handle."""

    def accept(self, handle: BatchHandle, newest_version: int) -> BatchHandle:
        handle = dataclasses.replace(handle, policy_lag=newest_version - handle.weights_version,
                                     _store_object=self.store)
        self.stats.record(handle)
        return handle


def handles(k: int, rng: random.Random) -> list[BatchHandle]:
    return [BatchHandle(
        store="file:///scratch/run/store", batch_id=1_000_000_000 + i, frames=4096,
        weights_version=3, policy_lag=0, worker="tls://10.0.0.17:41234", device="cpu",
        episode_returns=tuple(rng.uniform(0, 500) for _ in range(20)),
        episode_lengths=tuple(rng.randint(1, 500) for _ in range(20)),
        path=f"batches/{1_000_000_000 + i:012d}-{rng.getrandbits(32):08x}.zip",
        shape=(512, 8), rollout_seconds=rng.random(), write_seconds=rng.random() / 100)
        for i in range(k)]


def per_handle_us(kind: type[HandOver], payload: bytes, k: int, rounds: int) -> float:
    """µs per handle to unpickle ``payload`` (a task's result) and take each handle."""
    over = kind(None)
    t0 = time.perf_counter()
    for _ in range(rounds):
        for h in pickle.loads(payload):
            over.take(h, 5)
    return (time.perf_counter() - t0) / (rounds * k) * 1e6


def in_process(k: int, repeats: int) -> dict[str, float]:
    payload = pickle.dumps(handles(k, random.Random(0)), protocol=5)
    got: dict[str, list[float]] = {"replace": [], "evolve": []}
    for _ in range(repeats):
        got["replace"].append(per_handle_us(ReplaceHandOver, payload, k, 20_000 // k))
        got["evolve"].append(per_handle_us(HandOver, payload, k, 20_000 // k))
    return {name: statistics.median(v) for name, v in got.items()}


def end_to_end(cluster, policy: torch.nn.Module, k: int, frames: int, batches: int,
               envs: int, per_handle_sync: bool) -> tuple[float, float]:
    """``(learner CPU µs per handle, handles/s)`` of one collection."""
    store = tempfile.mkdtemp(prefix="daskrl-handover-")
    try:
        with (Client(cluster, set_as_default=False) as client,
              daskrl.Collector("CartPole-v1", policy, store, client=client,
                               envs_per_worker=envs, frames_per_batch=frames,
                               batches_per_task=k, sync=False,
                               total_frames=frames * (batches + 4 * k * 2)) as c):
            it = iter(c)
            for _ in range(4 * k * 2):  # warm: every stream's first tasks
                next(it)
            run = c._run
            c0, t0 = time.process_time(), time.perf_counter()
            if per_handle_sync:
                n = 0
                while client.sync(run.next_handle) is not None:
                    n += 1
            else:
                n = sum(1 for _ in it)
            c1, t1 = time.process_time(), time.perf_counter()
    finally:
        shutil.rmtree(store, ignore_errors=True)
    return (c1 - c0) / n * 1e6, n / (t1 - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--k", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--frames-per-batch", type=int, default=256)
    p.add_argument("--envs-per-worker", type=int, default=8)
    p.add_argument("--batches", type=int, default=480)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()

    print("1. in process: unpickle a task's result + HandOver.take, µs per handle (medians of "
          f"{args.repeats})")
    print(f"{'k':>5s} {'dataclasses.replace':>20s} {'daskrl':>8s} {'ratio':>6s}")
    for k in (1, 8, 32, 256):
        r = in_process(k, args.repeats)
        print(f"{k:5d} {r['replace']:20.1f} {r['evolve']:8.1f} {r['evolve'] / r['replace']:6.2f}",
              flush=True)

    torch.set_num_threads(1)
    env = gym.make("CartPole-v1")
    policy = make_policy("greedy", env.observation_space, env.action_space)
    variants = {"event loop per handle": True, "daskrl": False}
    got = {(k, v): [] for k in args.k for v in variants}
    print(f"\n2. end to end: {args.workers} workers, greedy CartPole, {args.frames_per_batch} "
          f"frames per batch, async, {args.batches} batches per run")
    with local_cluster(args.workers) as cluster:
        for r in range(args.repeats):
            for k in args.k:
                for name, per_handle_sync in variants.items():
                    got[k, name].append(end_to_end(cluster, policy, k, args.frames_per_batch,
                                                   args.batches, args.envs_per_worker,
                                                   per_handle_sync))
                    cpu, rate = got[k, name][-1]
                    print(f"  repeat {r} k={k} {name}: {cpu:.0f} µs/handle, {rate:.0f} "
                          "handles/s", flush=True)
    print(f"\nlearner CPU µs per handle (handles/s), medians of {args.repeats}")
    print(f"{'k':>5s} {'event loop per handle':>24s} {'daskrl':>16s} {'ratio':>6s}")
    for k in args.k:
        med = {v: (statistics.median(c for c, _ in got[k, v]),
                   statistics.median(h for _, h in got[k, v])) for v in variants}
        before, after = med["event loop per handle"], med["daskrl"]
        print(f"{k:5d} {before[0]:15.0f} ({before[1]:5.0f}) {after[0]:8.0f} ({after[1]:5.0f}) "
              f"{after[0] / before[0]:6.2f}")


if __name__ == "__main__":
    main()
