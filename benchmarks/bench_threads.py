"""Torch's threads on workers without a nanny: sized to the worker, or one per core.

A ``dask worker --no-nanny`` (a SLURM job's worker often is one) gets no ``OMP_NUM_THREADS=1``
from a nanny, and torch starts one intra-op thread per core in each worker. daskrl now gives
torch the worker's own thread count (``daskrl.worker._threads``). This measures both on the
same cluster: a ``dask scheduler`` and ``--workers`` ``dask worker --nthreads 1 --no-nanny``
processes with no thread variable set, collecting CartPole-v1 with ``MLPPolicy(--hidden)``,
``--envs-per-worker`` envs and ``--frames-per-batch`` frames, ``--batches`` batches a run:

* ``sized``: daskrl's default (torch at the worker's one thread);
* ``per core``: ``env_vars={"OMP_NUM_THREADS": <cores>}``, torch's own default, as before.

The two alternate, ``--repeats`` times, after one untimed warm-up run each; the table gives
the median time a run, frames/s and the ratio sized/per-core with its range.

Run:  python benchmarks/bench_threads.py [--json threads.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from distributed import Client

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_scale import start_cluster  # noqa: E402

from daskrl import Collector  # noqa: E402
from daskrl.policies import MLPPolicy  # noqa: E402

BARE = {"OMP_NUM_THREADS": "", "MKL_NUM_THREADS": "", "OPENBLAS_NUM_THREADS": ""}


def _forget_thread_vars() -> None:
    for var in BARE:
        os.environ.pop(var, None)


def one_run(client: Client, args: argparse.Namespace, policy: MLPPolicy, url: str,
            env_vars: dict[str, str]) -> tuple[float, int]:
    """Seconds from iterating to the last handle, and the torch threads the workers had."""
    with Collector("CartPole-v1", policy, url, client=client, envs_per_worker=args.envs_per_worker,
                   frames_per_batch=args.frames_per_batch,
                   total_frames=args.batches * args.frames_per_batch,
                   env_vars=env_vars) as collector:
        t0 = time.perf_counter()
        n = sum(1 for _ in collector)
        seconds = time.perf_counter() - t0
        threads = client.run(lambda: __import__("torch").get_num_threads())
    client.run(_forget_thread_vars)  # env_vars stay set on a worker: not into the next run
    assert n == args.batches, n
    return seconds, max(threads.values())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--envs-per-worker", type=int, default=8)
    p.add_argument("--frames-per-batch", type=int, default=1024)
    p.add_argument("--batches", type=int, default=48)
    p.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json")
    args = p.parse_args()
    cores = os.cpu_count() or 1
    configs = {"sized": {}, "per core": {"OMP_NUM_THREADS": str(cores)}}
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    policy = MLPPolicy(env.observation_space, env.action_space, tuple(args.hidden))
    times: dict[str, list[float]] = {k: [] for k in configs}
    threads: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        procs, address = start_cluster(Path(tmp), args.workers, BARE)
        try:
            with Client(address, timeout=60) as client:
                client.wait_for_workers(args.workers, timeout=60)
                for run in range(args.repeats + 1):  # the first is a warm-up
                    for name, env_vars in configs.items():
                        seconds, threads[name] = one_run(client, args, policy,
                                                         f"{tmp}/s-{run}-{len(times[name])}"
                                                         f"-{name.replace(' ', '')}", env_vars)
                        if run:
                            times[name].append(seconds)
                        print(f"run {run} {name:>8}: {seconds:6.2f} s, torch threads "
                              f"{threads[name]}", flush=True)
        finally:
            procs.kill_all()
    frames = args.batches * args.frames_per_batch
    ratios = [b / a for a, b in zip(times["sized"], times["per core"])]
    print(f"\n{args.workers} workers x --nthreads 1 --no-nanny on {cores} cores, "
          f"{args.batches} batches of {args.frames_per_batch} frames, MLP {args.hidden}")
    print(f"{'torch threads':>16} {'s/run':>8} {'frames/s':>10}")
    for name in configs:
        med = statistics.median(times[name])
        print(f"{name + ' (' + str(threads[name]) + ')':>16} {med:8.2f} {frames / med:10.0f}")
    print(f"speed-up sized/per-core: {statistics.median(ratios):.2f}x "
          f"(range {min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)} repeats)")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "cores": cores,
                                               "times": times, "threads": threads,
                                               "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
