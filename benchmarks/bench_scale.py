"""Per-batch CPU of the scheduler and the learner, and per-version weights cost, vs workers.

The cluster is started the way users start one on many machines (``tests/cli_cluster.py``): a
``dask scheduler`` process and N ``dask worker --nthreads 1`` processes (``--no-nanny``, to keep
32 workers in memory), all on loopback, no TLS. The learner (this process) connects a
``Client``, so the three kinds of CPU are told apart:

* scheduler CPU: the scheduler process's ``time.process_time()`` (read there with
  ``client.run_on_scheduler``: every thread, nanosecond resolution) over the timed run, raw and
  less its idle rate (heartbeats, ticks: measured for ``--idle-seconds`` just before, with the
  same workers connected) times the run's wall time; also the scheduler's task transitions;
* scheduler messages per batch, by operation (RPCs and batched-stream messages, counted by
  wrapping the scheduler's handlers), the idle-time ones (heartbeats) included;
* learner CPU: this process's ``time.process_time()`` over the timed run (every thread: the
  client's event loop, hand-over, the run's supervision);
* worker CPU is not counted (the workers oversubscribe the cores: that is fine, the two costs
  above are per batch, not per second).

For each N in ``--workers``: ``daskrl.Collector`` collects CartPole-v1 (``--envs-per-worker``,
``--frames-per-batch``, ``MLPPolicy(64, 64)``), sync or async (``--modes``), after an untimed
warm-up run; ``--batches-per-worker`` batches per worker, at least ``--min-batches`` in all.
Both CPU figures are divided by the batches handed over. Then, on the same cluster, for each
policy size in ``--weights-mib``: ``--versions`` weights versions published with
``Collector.update_weights`` (after two untimed ones), timed per version (median) as

* ``publish``: ``update_weights(policy)``: the learner's call (one copy to one seed worker;
  the others fetch when their next batch starts);
* ``fanout``: ``update_weights(policy, wait=True)``: until every worker has the version,

through shared memory (workers on the learner's host), through Dask transfers
(``shared_memory=False``: what workers on other hosts get) and through the store
(``weights_in_store=True``: one file per version, read once per host), with the scheduler's
and the learner's CPU per version (``--transports``).

It prints tables, the least-squares slope of scheduler and learner CPU per batch against N,
and writes ``--json``. ``docs/scaling.md`` turns these into a model.

Run:  python benchmarks/bench_scale.py --workers 1 2 4 8 16 32 [--json scale.json]
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

import gymnasium as gym
import numpy as np
import torch
from distributed import Client

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from cli_cluster import (  # noqa: E402
    DASK,
    Processes,
    scheduler_address,
    scheduler_args,
    wait_for_file,
)

from daskrl import Collector  # noqa: E402
from daskrl.policies import MLPPolicy  # noqa: E402

ENV = "CartPole-v1"
HIDDEN = (64, 64)


ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
"""The thread variables a nanny would set."""


def start_cluster(tmp: Path, n: int, thread_env: dict[str, str] = ONE_THREAD
                  ) -> tuple[Processes, str]:
    """A ``dask scheduler`` and ``n`` one-thread ``dask worker`` processes (no nanny), all
    with ``thread_env``."""
    procs = Processes(tmp)
    sched = tmp / "scheduler.json"
    procs.start("scheduler", scheduler_args(sched), thread_env)
    wait_for_file(sched, procs)
    env = {**thread_env,
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for i in range(n):
        procs.start(f"worker-{i}", [*DASK, "worker", "--scheduler-file", str(sched),
                                    "--nthreads", "1", "--no-nanny", "--host", "127.0.0.1",
                                    "--no-dashboard", "--name", f"w{i}", "--local-directory",
                                    str(tmp / f"w{i}-space")], env)
    return procs, scheduler_address(sched)


def _scheduler_counters(dask_scheduler=None) -> tuple[float, int, dict[str, int]]:
    return (time.process_time(), dask_scheduler.transition_counter,
            dict(getattr(dask_scheduler, "_bench_scale_ops", {})))


def _identity_cpu(dask_scheduler=None, calls: int = 20) -> float:
    """Scheduler CPU seconds of one ``identity(n_workers=-1)`` answer (what the collector's
    health check asks for), averaged over ``calls``, message packing included."""
    from distributed.protocol import dumps

    t0 = time.process_time()
    for _ in range(calls):
        dumps(dask_scheduler.identity(n_workers=-1))
    return (time.process_time() - t0) / calls


def _count_scheduler_ops(dask_scheduler=None) -> None:
    """Wrap the scheduler's RPC and stream handlers to count the messages, by operation."""
    import functools
    import inspect

    if hasattr(dask_scheduler, "_bench_scale_ops"):
        return
    counts: dict[str, int] = {}
    dask_scheduler._bench_scale_ops = counts

    def wrap(kind: str, op: str, f):
        key = f"{kind}:{op}"
        if inspect.iscoroutinefunction(f):
            @functools.wraps(f)
            async def counted_async(*a, **k):
                counts[key] = counts.get(key, 0) + 1
                return await f(*a, **k)
            return counted_async

        @functools.wraps(f)
        def counted(*a, **k):
            counts[key] = counts.get(key, 0) + 1
            return f(*a, **k)
        return counted

    for op, f in list(dask_scheduler.handlers.items()):
        dask_scheduler.handlers[op] = wrap("rpc", op, f)
    for op, f in list(dask_scheduler.stream_handlers.items()):
        dask_scheduler.stream_handlers[op] = wrap("stream", op, f)


class SchedulerMeter:
    """The scheduler process's CPU seconds and transitions, read on the scheduler."""

    def __init__(self, client: Client) -> None:
        self.client = client
        client.run_on_scheduler(_count_scheduler_ops)

    def read(self) -> tuple[float, int]:
        cpu_s, transitions, self.ops = self.client.run_on_scheduler(_scheduler_counters)
        return cpu_s, transitions

    def idle_rate(self, seconds: float) -> float:
        """Scheduler CPU seconds per second with nothing submitted."""
        c0, _ = self.read()
        t0 = time.perf_counter()
        time.sleep(seconds)
        c1, _ = self.read()
        return (c1 - c0) / (time.perf_counter() - t0)


def collect_run(client: Client, sched: SchedulerMeter, store: str, n: int, batches: int,
                args: argparse.Namespace, sync: bool) -> dict:
    probe = gym.make(ENV)
    policy = MLPPolicy(probe.observation_space, probe.action_space, hidden=HIDDEN)
    probe.close()
    kw = dict(envs_per_worker=args.envs_per_worker, frames_per_batch=args.frames_per_batch,
              num_workers=n, rounds=sync)
    with Collector(ENV, policy, store + "-warm", client=client,
                   total_frames=n * args.frames_per_batch, **kw) as warm:
        for _ in warm:
            pass
    with Collector(ENV, policy, store, client=client,
                   total_frames=batches * args.frames_per_batch, **kw) as collector:
        idle = sched.idle_rate(args.idle_seconds)
        (s0, x0), l0, t0 = sched.read(), time.process_time(), time.perf_counter()
        ops0 = sched.ops
        handles = 0
        for _ in collector:
            handles += 1
        (s1, x1), l1, t1 = sched.read(), time.process_time(), time.perf_counter()
    wall = t1 - t0
    ops = {k: (v - ops0.get(k, 0)) / handles for k, v in sched.ops.items()
           if v - ops0.get(k, 0) > 0}
    return {"workers": n, "mode": "sync" if sync else "async", "batches": handles,
            "wall_s": wall, "batches_per_s": handles / wall,
            "scheduler_idle_cpu_per_s": idle,
            "scheduler_cpu_ms_per_batch": 1e3 * (s1 - s0) / handles,
            "scheduler_busy_cpu_ms_per_batch": 1e3 * (s1 - s0 - idle * wall) / handles,
            "transitions_per_batch": (x1 - x0) / handles,
            "scheduler_messages_per_batch": sum(ops.values()),
            "scheduler_ops_per_batch": dict(sorted(ops.items(), key=lambda kv: -kv[1])),
            "learner_cpu_ms_per_batch": 1e3 * (l1 - l0) / handles}


class BigPolicy(torch.nn.Module):
    """CartPole policy whose bulk is one unused matrix of ``mib`` MiB (always action 0)."""

    def __init__(self, mib: float) -> None:
        super().__init__()
        side = max(1, int((mib * 2**20 / 4) ** 0.5))
        self.weight = torch.nn.Parameter(torch.randn(side, side))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.zeros(obs.shape[0], dtype=torch.int64)


TRANSPORTS = ("shared-memory", "dask", "store")


def weights_run(client: Client, sched: SchedulerMeter, store: str, n: int, mib: float,
                versions: int, transport: str) -> dict:
    policy = BigPolicy(mib)
    out: dict[str, list[float]] = {"publish": [], "fanout": [], "publish_sched_cpu": [],
                                   "fanout_sched_cpu": [], "publish_learner_cpu": [],
                                   "fanout_learner_cpu": []}
    with Collector(ENV, policy, store, client=client, envs_per_worker=1, frames_per_batch=1,
                   total_frames=None, num_workers=n, shared_memory=transport == "shared-memory",
                   weights_in_store=transport == "store") as collector:
        for _ in range(2):  # steady state: buffers and mappings exist
            collector.update_weights(policy, wait=True)
        for _ in range(versions):
            for kind, wait in (("publish", False), ("fanout", True)):
                (s0, _), l0, t0 = sched.read(), time.process_time(), time.perf_counter()
                collector.update_weights(policy, wait=wait)
                t1 = time.perf_counter()
                out[kind].append(t1 - t0)
                out[f"{kind}_sched_cpu"].append(sched.read()[0] - s0)
                out[f"{kind}_learner_cpu"].append(time.process_time() - l0)
        assert collector.weights_transport == transport, collector.weights_transport
    return {"workers": n, "mib": mib, "transport": transport,
            **{k: statistics.median(v) for k, v in out.items()}}


def slope(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of ys against xs."""
    if len(xs) < 2:
        return float("nan"), ys[0] if ys else float("nan")
    a, b = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(a), float(b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--envs-per-worker", type=int, default=4)
    parser.add_argument("--frames-per-batch", type=int, default=4096)
    parser.add_argument("--batches-per-worker", type=int, default=4)
    parser.add_argument("--min-batches", type=int, default=32)
    parser.add_argument("--modes", nargs="+", choices=["sync", "async"], default=["sync", "async"])
    parser.add_argument("--weights-mib", nargs="*", type=float, default=[1, 100])
    parser.add_argument("--versions", type=int, default=3)
    parser.add_argument("--transports", nargs="+", choices=TRANSPORTS, default=list(TRANSPORTS))
    parser.add_argument("--big-weights-max-workers", type=int, default=16,
                        help="weights of 10 MiB or more only up to this many workers (memory)")
    parser.add_argument("--idle-seconds", type=float, default=2.0,
                        help="how long to measure the scheduler's idle CPU before each run")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"cpu count {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}; {ENV}, "
          f"{args.envs_per_worker} envs/worker, {args.frames_per_batch} frames/batch, "
          f"MLP {HIDDEN}; scheduler and workers are CLI processes, learner is this one",
          flush=True)
    collect: list[dict] = []
    weights: list[dict] = []
    identity: list[dict] = []
    for n in args.workers:
        with tempfile.TemporaryDirectory(prefix="daskrl-scale-") as tmp_s:
            tmp = Path(tmp_s)
            procs, address = start_cluster(tmp, n)
            try:
                with Client(address, set_as_default=False) as client:
                    client.wait_for_workers(n, timeout=300)
                    sched = SchedulerMeter(client)
                    identity_ms = 1e3 * client.run_on_scheduler(_identity_cpu)
                    print(f"  N={n:3d}: scheduler CPU of one identity(n_workers=-1): "
                          f"{identity_ms:.3f} ms", flush=True)
                    identity.append({"workers": n, "identity_cpu_ms": identity_ms})
                    batches = max(args.min_batches, args.batches_per_worker * n)
                    for mode in args.modes:
                        r = collect_run(client, sched, f"{tmp}/store-{mode}", n, batches, args,
                                        mode == "sync")
                        collect.append(r)
                        print(f"  N={n:3d} {mode:5s}: {r['batches']} batches, "
                              f"{r['batches_per_s']:.1f} batches/s, scheduler "
                              f"{r['scheduler_cpu_ms_per_batch']:.2f} ms/batch (busy "
                              f"{r['scheduler_busy_cpu_ms_per_batch']:.2f}), learner "
                              f"{r['learner_cpu_ms_per_batch']:.2f} ms/batch", flush=True)
                    for mib in args.weights_mib:
                        if mib >= 10 and n > args.big_weights_max_workers:
                            continue
                        for transport in args.transports:
                            w = weights_run(client, sched, f"{tmp}/weights-{mib}-{transport}",
                                            n, mib, args.versions, transport)
                            weights.append(w)
                            print(f"  N={n:3d} weights {mib:g} MiB {w['transport']:13s}: "
                                  f"publish {w['publish'] * 1e3:.1f} ms (scheduler CPU "
                                  f"{w['publish_sched_cpu'] * 1e3:.1f} ms), fan-out "
                                  f"{w['fanout'] * 1e3:.1f} ms (scheduler CPU "
                                  f"{w['fanout_sched_cpu'] * 1e3:.1f} ms)", flush=True)
            finally:
                procs.kill_all()

    print("\nper 4096-frame batch (CPU milliseconds):" if args.frames_per_batch == 4096 else
          f"\nper {args.frames_per_batch}-frame batch (CPU milliseconds):")
    print(f"{'workers':>7s} {'mode':>5s} {'batches':>7s} {'batch/s':>8s} {'sched ms':>9s} "
          f"{'sched busy':>10s} {'sched idle/s':>12s} {'transitions':>11s} {'messages':>8s} "
          f"{'learner ms':>10s}")
    for r in collect:
        print(f"{r['workers']:7d} {r['mode']:>5s} {r['batches']:7d} {r['batches_per_s']:8.1f} "
              f"{r['scheduler_cpu_ms_per_batch']:9.2f} "
              f"{r['scheduler_busy_cpu_ms_per_batch']:10.2f} "
              f"{r['scheduler_idle_cpu_per_s'] * 1e3:9.1f} ms {r['transitions_per_batch']:11.1f} "
              f"{r['scheduler_messages_per_batch']:8.1f} {r['learner_cpu_ms_per_batch']:10.2f}")
    for r in collect:
        ops = ", ".join(f"{k} {v:.2f}" for k, v in r["scheduler_ops_per_batch"].items())
        print(f"  messages to the scheduler per batch, N={r['workers']} {r['mode']}: {ops}")
    fits = {}
    for mode in args.modes:
        rows = [r for r in collect if r["mode"] == mode]
        xs = [r["workers"] for r in rows]
        for who in ("scheduler", "scheduler_busy", "learner"):
            a, b = slope(xs, [r[f"{who}_cpu_ms_per_batch"] for r in rows])
            fits[f"{mode}_{who}"] = {"ms_per_batch_per_worker": a, "ms_per_batch_at_0": b}
            print(f"fit {mode:5s} {who:14s}: CPU per batch = {b:.2f} ms + {a:.4f} ms x workers")
        a, b = slope(xs, [r["scheduler_idle_cpu_per_s"] * 1e3 for r in rows])
        fits[f"{mode}_scheduler_idle"] = {"ms_per_s_per_worker": a, "ms_per_s_at_0": b}
        print(f"fit {mode:5s} scheduler idle: {b:.2f} ms/s + {a:.3f} ms/s x workers")
    a, b = slope([r["workers"] for r in identity], [r["identity_cpu_ms"] for r in identity])
    fits["identity_cpu"] = {"ms_per_worker": a, "ms_at_0": b}
    print(f"fit identity(n_workers=-1) scheduler CPU: {b:.3f} ms + {a:.4f} ms x workers")
    if weights:
        print("\nper weights version (milliseconds; median of the versions):")
        print(f"{'workers':>7s} {'MiB':>5s} {'transport':>13s} {'publish':>8s} "
              f"{'sched CPU':>9s} {'learner CPU':>11s} {'fan-out':>8s} {'sched CPU':>9s} "
              f"{'learner CPU':>11s}")
        for w in weights:
            print(f"{w['workers']:7d} {w['mib']:5g} {w['transport']:>13s} "
                  f"{w['publish'] * 1e3:8.1f} {w['publish_sched_cpu'] * 1e3:9.1f} "
                  f"{w['publish_learner_cpu'] * 1e3:11.1f} {w['fanout'] * 1e3:8.1f} "
                  f"{w['fanout_sched_cpu'] * 1e3:9.1f} {w['fanout_learner_cpu'] * 1e3:11.1f}")
        for mib in args.weights_mib:
            for transport in TRANSPORTS:
                rows = [w for w in weights if w["mib"] == mib and w["transport"] == transport]
                if rows:
                    a, b = slope([w["workers"] for w in rows], [w["fanout"] * 1e3 for w in rows])
                    fits[f"fanout_{mib:g}MiB_{transport}"] = {"ms_per_worker": a, "ms_at_0": b}
                    print(f"fit fan-out {mib:g} MiB {transport}: {b:.1f} ms + {a:.2f} ms x "
                          "workers")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"cpu_count": os.cpu_count(), "args": vars(args), "collect": collect,
             "weights": weights, "identity": identity, "fits": fits}, indent=2))


if __name__ == "__main__":
    main()
