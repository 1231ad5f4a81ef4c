"""Where a worker's time goes per batch, outside the env-and-policy loop.

Throughput ratios on a shared VM swing with the machine's speed (``bench_collect.py``); these
figures are durations measured inside one worker process, each a few milliseconds, so they
hold where the ratios do not. For each worker count N in ``--workers`` and mode in
``--modes``, ``daskrl.Collector`` collects CartPole-v1 on the embedded cluster's set-up
(``daskrl.deploy.local_cluster(N)``: TLS, one-thread workers), 8 envs per worker, 4096-frame
batches, with ``MLPPolicy(64, 64)``'s greedy network (the cheapest policy, where fixed costs
weigh most), after an untimed warm-up run. Dask's task stream (``get_task_stream``) gives each
task's start and stop on its worker, and each handle its rollout and write seconds, so per
batch on a worker:

* rollout: the env-and-policy loop (``EnvSet.collect``'s own timer);
* write: the batch's zarr container and commit record;
* task, other: the task's time outside both (looking up the plugin and envs, the arrays'
  bookkeeping at the batch's end, the handle);
* between tasks: from a task's stop to the worker's next task's start (the result handed to
  Dask, the next task taken from the queue);

and the fixed share, (write + task other + between) / the whole, as medians over the batches.
Also the learner process's CPU per handle (``time.process_time``, every thread: the client,
the embedded scheduler and the nannies), which at N = 2 on 2 cores comes out of the workers'
share of the machine.

Run:  python benchmarks/bench_task_overhead.py [--workers 1 2] [--batches-per-worker 40]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import gymnasium as gym
from bench_collect import ENVS_PER_WORKER, FRAMES_PER_BATCH, make_policy, print_table
from distributed import Client, get_task_stream

from daskrl import Collector
from daskrl.deploy import local_cluster


def per_batch(tasks: list[dict], handles: dict[int, object]) -> dict[str, float]:
    """Median seconds per batch of each part, over every worker's batches (``tasks``: Dask's
    task stream; ``handles`` by batch id)."""
    parts: dict[str, list[float]] = {"rollout": [], "write": [], "task other": [], "between": []}
    by_worker: dict[str, list[tuple[float, float, int]]] = {}
    for t in tasks:
        compute = [s for s in t["startstops"] if s["action"] == "compute"]
        prefix, _, batch = str(t["key"]).rpartition("-")  # daskrl-collect-<run>-<batch id>
        if prefix.startswith("daskrl-collect-") and batch.isdigit() and compute:
            by_worker.setdefault(t["worker"], []).append(
                (compute[0]["start"], compute[0]["stop"], int(batch)))
    for spans in by_worker.values():
        spans.sort()
        for (start, stop, batch), nxt in zip(spans, [*spans[1:], None]):
            h = handles[batch]
            parts["rollout"].append(h.rollout_seconds)
            parts["write"].append(h.write_seconds)
            parts["task other"].append(stop - start - h.rollout_seconds - h.write_seconds)
            if nxt is not None:
                parts["between"].append(nxt[0] - stop)
    return {k: statistics.median(v) for k, v in parts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--modes", nargs="+", choices=["sync", "async"],
                        default=["sync", "async"])
    parser.add_argument("--batches-per-worker", type=int, default=40)
    args = parser.parse_args()
    probe = gym.make("CartPole-v1")
    policy = make_policy("greedy", probe.observation_space, probe.action_space)
    rows = []
    for n in args.workers:
        with local_cluster(n) as cluster, Client(cluster) as client, \
                tempfile.TemporaryDirectory(prefix="daskrl-bench-") as tmp:
            for mode in args.modes:
                for run, batches in (("warm", 2), ("timed", args.batches_per_worker)):
                    with get_task_stream(client) as stream, Collector(
                            "CartPole-v1", policy, f"{tmp}/{mode}-{run}", client=client,
                            rounds=mode == "sync", num_workers=n, envs_per_worker=ENVS_PER_WORKER,
                            frames_per_batch=FRAMES_PER_BATCH,
                            total_frames=batches * n * FRAMES_PER_BATCH) as collector:
                        cpu = time.process_time()
                        handles = list(collector)
                        cpu = time.process_time() - cpu
                m = per_batch(stream.data, {h.batch_id: h for h in handles})
                whole = sum(m.values())
                rows.append([n, mode, len(handles), m["rollout"] * 1e3, m["write"] * 1e3,
                             m["task other"] * 1e3, m["between"] * 1e3,
                             f"{(whole - m['rollout']) / whole:.1%}",
                             cpu / len(handles) * 1e3])
                print(f"  done N={n} {mode}", flush=True)
    print("\nper batch on a worker (milliseconds, medians), CartPole-v1 greedy, 4096 frames:")
    print_table(["workers", "mode", "batches", "rollout", "write", "task other", "between tasks",
                 "fixed share", "learner CPU/handle"], rows)


if __name__ == "__main__":
    main()
