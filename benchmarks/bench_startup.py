"""Start-up: how long until the first batch, and where the time goes.

Two measurements, each repeated (``--repeats``), each with a breakdown by phase:

(a) warm cluster: a ``LocalCluster`` is already running with its workers up (the embedded
    cluster's set-up, ``daskrl.deploy.local_cluster(N)``: TLS, one-thread workers); the time
    from ``Collector(...)`` to the first handle out of ``next(iter(collector))``. The first
    collector on a fresh cluster also pays the workers' first import of torch and daskrl
    ("first"); the later ones find them imported ("later"). Target: within 2 s.
(b) ``daskrl collect --env CartPole-v1`` on the embedded default (TLS, one worker per core), a
    subprocess as a user runs it; the time from starting the process to the first commit
    record in the store (the first batch written and committed), and to the first progress
    update (the first handle in the learner). Target: within 4 s. The breakdown comes from a
    second, instrumented run (``--cli-child``) that times phases around daskrl's own
    functions with the same monotonic clock.

The floor for (b) is ``python -c pass`` on this machine, measured in the same run; the ratios
printed are each figure over its target. The machine may be shared: repeat and read the spread.

Run:  python benchmarks/bench_startup.py [--repeats 3] [--workers 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TARGET_WARM = 2.0
TARGET_CLI = 4.0

# -- phase timing: wrap a function (sync or async) so that each call's span is recorded -------

SPANS: list[tuple[str, float, float]] = []


def _wrap(owner: Any, attr: str, label: str) -> None:
    """Record each call of ``owner.attr`` in :data:`SPANS`; an awaitable it returns (a
    coroutine function, or a ``Client`` method called inside the event loop) is timed until it
    is done."""
    fn = getattr(owner, attr)

    async def timed(awaitable: Any, t0: float) -> Any:
        try:
            return await awaitable
        finally:
            SPANS.append((label, t0, time.monotonic()))

    @functools.wraps(fn)
    def wrapper(*a: Any, **k: Any) -> Any:
        t0 = time.monotonic()
        result = fn(*a, **k)
        if asyncio.iscoroutine(result) or asyncio.isfuture(result):
            return timed(result, t0)
        SPANS.append((label, t0, time.monotonic()))
        return result

    setattr(owner, attr, wrapper)


def instrument() -> None:
    """Wrap the phases of a collector's start (learner side) in :data:`SPANS` timers."""
    instrument_cli()
    instrument_learner()


def instrument_cli() -> None:
    """Wrap what ``daskrl collect`` runs before it imports torch (importing nothing heavier
    than the command itself): the embedded cluster's start, the env check, the policy build;
    the policy build also wraps the rest (:func:`instrument_learner`) once torch is in."""
    from distributed import Security

    import daskrl.cli._collect as cli_collect
    import daskrl.collect._env_list as env_list
    import daskrl.deploy._cluster as cluster

    _wrap(Security, "temporary", "TLS credentials")
    _wrap(cluster, "local_cluster", "cluster start (scheduler, nannies, workers)")
    _wrap(env_list, "resolve_envs", "env check (learner)")
    make_policy = cli_collect.make_policy

    def imports_and_policy(*a: Any, **k: Any) -> Any:
        t0 = time.monotonic()
        instrument_learner()  # imports torch and the collector's modules, as the command would
        try:
            return make_policy(*a, **k)
        finally:
            SPANS.append(("learner imports (torch, collector) + policy build", t0,
                          time.monotonic()))

    cli_collect.make_policy = imports_and_policy


def instrument_learner() -> None:
    """Wrap the collector's own start-up phases (imports torch)."""
    from distributed import Client

    import daskrl.collect._collector as collector
    import daskrl.collect._env_list as env_list
    import daskrl.collect._startup as startup
    from daskrl.collect._run import Run
    from daskrl.collect._supervisor import Workers
    from daskrl.store._store import TrajectoryStore

    if getattr(instrument_learner, "done", False):
        return
    instrument_learner.done = True  # type: ignore[attr-defined]
    _wrap(collector, "local_cluster", "cluster start (scheduler, nannies, workers)")
    _wrap(env_list, "probe_envs", "env probe (learner)")
    _wrap(collector, "check_on_learner", "learner checks (env, policy, store)")
    _wrap(collector, "plan_resume", "resume plan")
    _wrap(Client, "register_plugin", "worker plugin install")
    _wrap(startup, "acheck_versions", "package versions check")
    _wrap(Workers, "refresh", "worker list")
    _wrap(startup, "_probe_store", "store probe (every worker)")
    _wrap(Run, "publish", "weights v0 publish + load (every worker)")
    _wrap(TrajectoryStore, "register_run", "run record")
    _wrap(Run, "next_handle", "first batch (rollout, write, handle)")


def breakdown(t_start: float, t_end: float) -> list[tuple[str, float, float]]:
    """Phases between ``t_start`` and ``t_end`` (first call of each) as (label, start offset,
    seconds), with what no phase covers; phases may overlap (the embedded cluster starts in a
    thread while the learner imports torch)."""
    out: list[tuple[str, float, float]] = []
    seen: set[str] = set()
    intervals: list[tuple[float, float]] = []
    for label, t0, t1 in sorted(SPANS, key=lambda s: s[1]):
        if label in seen or t0 < t_start or t0 > t_end:
            continue
        seen.add(label)
        out.append((label, t0 - t_start, t1 - t0))
        if label not in ("TLS credentials",):  # nested in the cluster's start
            intervals.append((t0, min(t1, t_end)))
    covered, reach = 0.0, t_start  # the union of the phases' intervals
    for t0, t1 in sorted(intervals):
        if t1 > reach:
            covered += t1 - max(t0, reach)
            reach = t1
    out.append(("other (glue, client connect, Python)", float("nan"),
                (t_end - t_start) - covered))
    return out


# -- (a) warm cluster -----------------------------------------------------------------------

def warm(workers: int, repeats: int, frames: int) -> dict[str, Any]:
    from distributed import Client

    from daskrl import Collector
    from daskrl.deploy import local_cluster
    from daskrl.policies import MLPPolicy

    instrument()
    results: list[dict[str, Any]] = []
    cluster = local_cluster(workers)
    with Client(cluster, set_as_default=False) as client, \
            tempfile.TemporaryDirectory() as tmp:
        client.wait_for_workers(workers)
        env = __import__("gymnasium").make("CartPole-v1")
        policy = MLPPolicy(env.observation_space, env.action_space)
        for i in range(repeats + 1):
            SPANS.clear()
            t0 = time.monotonic()
            c = Collector("CartPole-v1", policy, f"{tmp}/run{i}", client=client,
                          frames_per_batch=frames, total_frames=frames * 4)
            next(iter(c))
            t1 = time.monotonic()
            c.close()
            results.append({"seconds": t1 - t0, "phases": breakdown(t0, t1)})
    cluster.close()
    return {"first": results[0], "later": results[1:]}


# -- (b) the CLI, as a subprocess -----------------------------------------------------------

def _cli_args(store: str, frames: int) -> list[str]:
    return ["collect", "--env", "CartPole-v1", "--store", store, "--frames-per-batch",
            str(frames), "--frames", str(frames * 4), "--json"]


def cli_child(argv: list[str]) -> int:
    """Run the CLI in this process with phase timers; print the spans as JSON on fd 3."""
    t_main = time.monotonic()
    import daskrl.cli as cli

    t_imports = time.monotonic()
    instrument_cli()
    try:
        return int(cli.main(argv))
    finally:
        SPANS.append(("imports (daskrl.cli)", t_main, t_imports))
        with os.fdopen(int(os.environ["BENCH_STARTUP_FD"]), "w") as out:
            json.dump({"main": t_main, "spans": SPANS}, out)


def _first_commit(store: Path, proc: subprocess.Popen[bytes], deadline: float) -> float:
    while time.monotonic() < deadline:
        commits = store / "commits"  # commits/<id>/zarr.json; commits/zarr.json is the group's
        if commits.is_dir() and any(d.is_dir() and (d / "zarr.json").exists()
                                    for d in commits.iterdir()):
            return time.monotonic()
        if proc.poll() is not None:
            raise RuntimeError(f"daskrl collect exited ({proc.returncode}) before any commit")
        time.sleep(0.005)
    raise TimeoutError("no commit record within the deadline")


def cli(repeats: int, frames: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    floors, plain, traced = [], [], []
    for _ in range(repeats):
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-c", "pass"], check=True, env=env)
        floors.append(time.monotonic() - t0)
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            store = Path(tmp) / "store"
            t0 = time.monotonic()
            proc = subprocess.Popen(
                [sys.executable, "-m", "daskrl.cli", *_cli_args(str(store), frames)],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            t1 = _first_commit(store, proc, t0 + 120)
            _, err = proc.communicate(timeout=120)
            if proc.returncode:
                raise RuntimeError(err.decode())
            plain.append(t1 - t0)
        with tempfile.TemporaryDirectory() as tmp:
            store = Path(tmp) / "store"
            r, w = os.pipe()
            t0 = time.monotonic()
            proc = subprocess.Popen(
                [sys.executable, __file__, "--cli-child", *_cli_args(str(store), frames)],
                env={**env, "BENCH_STARTUP_FD": str(w)}, pass_fds=(w,),
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            os.close(w)
            t_commit = _first_commit(store, proc, t0 + 120)
            with os.fdopen(r) as f:
                record = json.load(f)
            _, err = proc.communicate(timeout=120)
            if proc.returncode:
                raise RuntimeError(err.decode())
            SPANS[:] = [tuple(s) for s in record["spans"]]
            first = [s for s in SPANS if s[0].startswith("first batch")]
            t_handle = first[0][2] if first else t_commit
            phases = [("Python start (interpreter, site)", 0.0, record["main"] - t0)]
            phases += breakdown(record["main"], t_handle)
            traced.append({"to_commit": t_commit - t0, "to_handle": t_handle - t0,
                           "phases": phases})
    return {"python_floor": floors, "plain_to_commit": plain, "traced": traced}


# -- report ---------------------------------------------------------------------------------

def _spread(xs: list[float]) -> str:
    if not xs:
        return "n/a"
    return (f"median {statistics.median(xs):.2f} s (min {min(xs):.2f}, max {max(xs):.2f}, "
            f"n={len(xs)})")


def _table(phases: list[list[Any]] | list[tuple[str, float, float]], total: float) -> None:
    print(f"    {'phase':<50} {'starts at':>9} {'takes':>8}")
    for label, at, sec in phases:
        start = "" if at != at else f"+{at:.2f} s"  # NaN: not a phase of its own
        print(f"    {label:<50} {start:>9} {sec:6.2f} s  {sec / total:5.0%}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--cli-child":
        raise SystemExit(cli_child(sys.argv[2:]))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=2, help="(a): workers of the warm cluster")
    p.add_argument("--frames-per-batch", type=int, default=4096)
    p.add_argument("--only", choices=("warm", "cli"), default=None)
    p.add_argument("--json", default=None, help="write the figures to this file")
    args = p.parse_args()
    load = os.getloadavg()[0]
    print(f"# start-up, {os.cpu_count()} cores, load average {load:.2f} at start "
          f"(other work on the machine slows every figure)")
    out: dict[str, Any] = {"load_average": load}
    if args.only in (None, "warm"):
        w = warm(args.workers, args.repeats, args.frames_per_batch)
        out["warm"] = w
        first, later = w["first"], [r["seconds"] for r in w["later"]]
        print(f"\n(a) Collector(...) -> first handle, warm LocalCluster of {args.workers} "
              f"workers, {args.frames_per_batch} frames/batch; target {TARGET_WARM:.0f} s")
        print(f"  first collector on the cluster: {first['seconds']:.2f} s "
              f"({first['seconds'] / TARGET_WARM:.2f} of the target)")
        _table(first["phases"], first["seconds"])
        print(f"  later collectors: {_spread(later)} "
              f"({statistics.median(later) / TARGET_WARM:.2f} of the target)")
        _table(w["later"][-1]["phases"], w["later"][-1]["seconds"])
    if args.only in (None, "cli"):
        c = cli(args.repeats, args.frames_per_batch)
        out["cli"] = c
        plain = c["plain_to_commit"]
        print(f"\n(b) `daskrl collect --env CartPole-v1` (embedded default: TLS, "
              f"{os.cpu_count()} workers) -> first commit record; target {TARGET_CLI:.0f} s")
        print(f"  python -c pass (floor): {_spread(c['python_floor'])}")
        print(f"  to the first commit: {_spread(plain)} "
              f"({statistics.median(plain) / TARGET_CLI:.2f} of the target)")
        tr = c["traced"]
        print(f"  instrumented runs: to the first commit {_spread([t['to_commit'] for t in tr])}"
              f", to the first handle {_spread([t['to_handle'] for t in tr])}")
        last = tr[-1]
        _table(last["phases"], last["to_handle"])
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
