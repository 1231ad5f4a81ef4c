"""Many workers, simulated honestly: the scheduler's and the learner's CPU at N workers.

Real ``distributed.Worker``s, many to a process: a ``dask scheduler`` process and
``--processes`` processes each running N / processes workers on one event loop (real
heartbeats, real comms to the scheduler and to the learner, real daskrl plugins and streams).
Their env is a cheap stand-in (``daskrl.testing.SlowEnv``: a counting env whose step sleeps)
that takes ``--batch-seconds`` per batch, so the batches are real, small (``--steps`` frames,
one env, ``TagPolicy``) and really written to a store on local disk; only the work an env
would do is replaced by a sleep.

For each N in ``--workers``: start the processes, wait for N workers, start an async
``daskrl.Collector`` (one stream per worker), take ``--warmup`` handles, then for
``--seconds``: the scheduler process's CPU (``time.process_time`` read there) less its idle
rate measured just before with the same workers connected (heartbeats: what N workers cost
with no collection), its task transitions, and the learner process's CPU; both per batch
handed over, and the raw scheduler CPU per second (cores). The batch rate is N /
``--batch-seconds`` at most: pick it so this machine's cores can drive it (each batch's
write costs its worker ~1-2 ms).

Run:  python benchmarks/bench_simulate.py --workers 10 100 300 [--json sim.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from distributed import Client

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_scale import SchedulerMeter  # noqa: E402
from cli_cluster import Processes, scheduler_address, scheduler_args, wait_for_file  # noqa: E402

THREADS_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
               "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
               "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "benchmarks"),
                                              str(ROOT / "tests"),
                                              os.environ.get("PYTHONPATH", "")])}
"""The processes' environment (the scheduler unpickles bench_scale's meters by name)."""


async def serve(address: str, n: int, prefix: str) -> None:
    """Run ``n`` workers on this event loop until the scheduler goes."""
    from distributed import Worker

    workers = [Worker(address, nthreads=1, name=f"{prefix}-{i}", memory_limit=0,
                      dashboard=False, host="127.0.0.1") for i in range(n)]
    for k in range(0, n, 25):  # 25 at a time: registering is the scheduler's work
        await asyncio.gather(*workers[k:k + 25])
    await asyncio.gather(*(w.finished() for w in workers))


def start(tmp: Path, n: int, processes: int) -> tuple[Processes, str]:
    procs = Processes(tmp)
    sched = tmp / "scheduler.json"
    procs.start("scheduler", scheduler_args(sched), THREADS_ENV)
    wait_for_file(sched, procs)
    address = scheduler_address(sched)
    per = [n // processes + (i < n % processes) for i in range(processes)]
    for p, k in enumerate(per):
        if k:
            procs.start(f"host-{p}", [sys.executable, __file__, "--serve", address, str(k),
                                      f"h{p}"], THREADS_ENV)
    return procs, address


def measure(client: Client, n: int, args: argparse.Namespace, store: str) -> dict:
    import daskrl
    from daskrl.testing import TagPolicy

    env = "daskrl.testing:SlowEnv"  # imported by the workers
    sched = SchedulerMeter(client)
    t_start = time.perf_counter()
    with daskrl.Collector(env, TagPolicy(), store, client=client, rounds=False,
                          env_kwargs={"delay": args.batch_seconds / args.steps,
                                      "length": 1000},
                          envs_per_worker=1, frames_per_batch=args.steps, num_workers=n,
                          total_frames=None, call_timeout=120) as c:
        it = iter(c)
        for _ in range(args.warmup):
            next(it)
        started = time.perf_counter() - t_start
        idle = sched.idle_rate(args.idle_seconds)
        (s0, x0), l0, t0 = sched.read(), time.process_time(), time.perf_counter()
        handles = 0
        while time.perf_counter() - t0 < args.seconds:
            next(it)
            handles += 1
        (s1, x1), l1, t1 = sched.read(), time.process_time(), time.perf_counter()
    wall = t1 - t0
    sched_cpu = (s1 - s0) - idle * wall
    return {"workers": n, "handles": handles, "wall_s": wall, "batches_per_s": handles / wall,
            "start_s": started, "sched_idle_cores": idle,
            "sched_cores": (s1 - s0) / wall,
            "sched_ms_per_batch": 1000 * sched_cpu / handles,
            "transitions_per_batch": (x1 - x0) / handles,
            "learner_cores": (l1 - l0) / wall,
            "learner_ms_per_batch": 1000 * (l1 - l0) / handles}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        asyncio.run(serve(sys.argv[2], int(sys.argv[3]), sys.argv[4]))
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, nargs="+", default=[10, 100, 300])
    p.add_argument("--processes", type=int, default=10)
    p.add_argument("--batch-seconds", type=float, nargs="+", default=None,
                   help="per N (default N / 100: 100 batches/s in all)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=0, help="default: N (each stream's first)")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--idle-seconds", type=float, default=5.0)
    p.add_argument("--json")
    args = p.parse_args()
    rows = []
    for i, n in enumerate(args.workers):
        run = argparse.Namespace(**vars(args))
        run.batch_seconds = (args.batch_seconds[i] if args.batch_seconds else n / 100)
        run.warmup = args.warmup or n
        with tempfile.TemporaryDirectory() as tmp:
            procs, address = start(Path(tmp), n, min(args.processes, n))
            try:
                with Client(address, timeout=120) as client:
                    t = time.perf_counter()
                    client.wait_for_workers(n, timeout=60 + n)
                    up = time.perf_counter() - t
                    row = measure(client, n, run, f"{tmp}/store")
                    row["workers_up_s"] = up
                    row["batch_seconds"] = run.batch_seconds
            finally:
                procs.kill_all()
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n{'N':>5} {'batch/s':>8} {'sched idle':>10} {'sched':>7} {'sched ms/b':>10} "
          f"{'trans/b':>8} {'learner':>8} {'learner ms/b':>12}")
    for r in rows:
        print(f"{r['workers']:>5} {r['batches_per_s']:8.1f} {r['sched_idle_cores']:10.3f} "
              f"{r['sched_cores']:7.3f} {r['sched_ms_per_batch']:10.3f} "
              f"{r['transitions_per_batch']:8.3f} {r['learner_cores']:8.3f} "
              f"{r['learner_ms_per_batch']:12.3f}")
    print("(sched, learner: cores; sched ms/b: less its idle rate; sched idle: heartbeats etc.)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
