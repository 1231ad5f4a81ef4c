"""Soak: a long collection, and whether anything grows — memory, descriptors, files.

A collector on the embedded default (``Collector(..., client=None)``: TLS, one-thread
workers, shared-memory weights) runs ``--batches`` small batches of CartPole-v1 with an
``MLPPolicy``; the learner publishes new weights every ``--update-every`` batches. Every
``--every`` batches it samples, for the learner and for each worker (through ``client.run``):

* RSS (``VmRSS`` of ``/proc/<pid>/status``), MiB;
* open file descriptors (entries of ``/proc/<pid>/fd``);
* shared-memory files of the run: the files under ``/dev/shm`` that any process of the run
  (the learner, which also hosts the scheduler and the nannies, and every worker) has open or
  mapped (``/proc/<pid>/fd``, ``/proc/<pid>/maps``) and that still have a name: weights
  segments, multiprocessing semaphores (``sem.mp-*``);
* the scheduler's history of finished work: its spans and their task groups (distributed
  keeps every span), to tell the learner's own memory from the in-process scheduler's;
* temporary files: every file under the run's own ``TMPDIR`` (a fresh directory set before
  anything starts, so the workers' ``dask-scratch-space`` and every ``tempfile`` lie in it).

Then a verdict per series: RSS flat within 10 % of its value at the end of the warm-up
(``--warmup`` batches); descriptors, shared-memory files and temporary files constant after it.
After the collector closes it also lists what is left: the run's shared-memory files (those
seen in its samples) still in ``/dev/shm`` (other programs' new files are counted apart), and
the files left in the run's ``TMPDIR``.

(``soak_faults.py`` is the other soak: workers killed, nothing lost or doubled.)

Run:  python benchmarks/bench_soak.py [--batches 2000] [--every 100] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SHM = Path("/dev/shm")


def _rss_mib(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _shm_files(pid: int | str = "self") -> set[str]:
    """The ``/dev/shm`` files process ``pid`` has open or mapped."""
    found: set[str] = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(fd_dir / fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith(str(SHM) + "/") and not target.endswith(" (deleted)"):
            found.add(target)
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith(str(SHM) + "/") \
                and not parts[5].endswith(" (deleted)"):  # unlinked: no file any more
            found.add(parts[5])
    return found


def _fd_kinds() -> dict[str, int]:
    """Open descriptors by kind: socket, pipe, anon_inode, or the file's directory."""
    kinds: dict[str, int] = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        kind = target.split(":")[0] if ":" in target and not target.startswith("/") \
            else os.path.dirname(target)
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def process_sample() -> dict[str, Any]:
    """This process's RSS (MiB), open descriptors and ``/dev/shm`` files (run on workers too)."""
    return {"pid": os.getpid(), "rss": _rss_mib(), "fds": len(os.listdir("/proc/self/fd")),
            "fd_kinds": _fd_kinds(), "shm": sorted(_shm_files())}


def _scheduler_history(dask_scheduler: Any) -> dict[str, int]:
    """What the scheduler keeps of finished work (it runs in the learner's process here)."""
    spans = dask_scheduler.extensions.get("spans")
    return {"spans": len(spans.spans) if spans is not None else -1,
            "span_groups": sum(len(sp.groups) for sp in spans.spans.values()) if spans else -1,
            "tasks": len(dask_scheduler.tasks)}


def _files_under(root: str) -> list[str]:
    return sorted(str(Path(d, f).relative_to(root)) for d, _, fs in os.walk(root) for f in fs)


def sample(collector: Any, batches: int, tmp: str) -> dict[str, Any]:
    learner = process_sample()
    workers = collector.client.run(process_sample)
    shm = set(learner["shm"]).union(*(set(w["shm"]) for w in workers.values()))
    return {"batches": batches, "t": time.monotonic(),
            "learner_rss": learner["rss"], "learner_fds": learner["fds"],
            "learner_fd_kinds": learner["fd_kinds"],
            "scheduler": collector.client.run_on_scheduler(_scheduler_history),
            "workers": {a: {"rss": w["rss"], "fds": w["fds"], "pid": w["pid"],
                            "fd_kinds": w["fd_kinds"]}
                        for a, w in sorted(workers.items())},
            "shm_files": sorted(shm), "tmp_files": _files_under(tmp)}


def _slope(batches: list[int], values: list[float]) -> float:
    """Least-squares slope of ``values`` per 1,000 batches."""
    n = len(values)
    if n < 2:
        return 0.0
    mb, mv = sum(batches) / n, sum(values) / n
    den = sum((b - mb) ** 2 for b in batches)
    return 1000 * sum((b - mb) * (v - mv) for b, v in zip(batches, values)) / den if den else 0.0


def _verdict_flat(values: list[float], ref: float, batches: list[int],
                  tol: float = 0.10) -> tuple[bool, str]:
    top, low = max(values), min(values)
    ok = top <= ref * (1 + tol) and low >= ref * (1 - tol)
    return ok, (f"{'flat' if ok else 'NOT flat'} within {tol:.0%} of {ref:.1f} "
                f"(after warm-up: {low:.1f}..{top:.1f}, {100 * (top - ref) / ref:+.1f} % at most;"
                f" slope {_slope(batches, values):+.2f} MiB per 1,000 batches)")


def _verdict_constant(values: list[int], ref: int) -> tuple[bool, str]:
    ok = all(v == ref for v in values)
    return ok, (f"{'constant' if ok else 'NOT constant'} at {ref}" if ok else
                f"NOT constant: {ref} at the end of the warm-up, then {min(values)}..{max(values)},"
                f" last {values[-1]}")


def report(samples: list[dict[str, Any]], warmup: int) -> dict[str, bool]:
    after = [s for s in samples if s["batches"] >= warmup]
    ref = after[0]
    series: dict[str, tuple[list[Any], str]] = {
        "learner RSS (MiB)": ([s["learner_rss"] for s in samples], "flat"),
        "learner fds": ([s["learner_fds"] for s in samples], "constant"),
    }
    for addr in ref["workers"]:
        name = addr.rsplit(":", 1)[-1]
        series[f"worker {name} RSS (MiB)"] = (
            [s["workers"].get(addr, {}).get("rss", float("nan")) for s in samples], "flat")
        series[f"worker {name} fds"] = (
            [s["workers"].get(addr, {}).get("fds", -1) for s in samples], "constant")
    series["shm files of the run"] = ([len(s["shm_files"]) for s in samples], "constant")
    series["tmp files of the run"] = ([len(s["tmp_files"]) for s in samples], "constant")
    print("\nbatches: " + " ".join(f"{s['batches']:>7}" for s in samples))
    verdicts: dict[str, bool] = {}
    for label, (values, kind) in series.items():
        fmt = "{:>7.1f}" if kind == "flat" else "{:>7d}"
        print(f"{label}:\n         " + " ".join(fmt.format(v) for v in values))
        i0 = samples.index(ref)
        tail = values[i0 + 1:] or values[i0:]
        ok, text = (_verdict_flat(tail, values[i0], [s["batches"] for s in samples][i0 + 1:])
                    if kind == "flat" else _verdict_constant(tail, values[i0]))
        verdicts[label] = ok
        print(f"  -> {text}")
    first, last = ref["learner_fd_kinds"], samples[-1]["learner_fd_kinds"]
    grown = {k: (first.get(k, 0), v) for k, v in last.items() if v != first.get(k, 0)}
    if grown:
        print(f"  learner fds that changed after the warm-up, by kind (then, last): {grown}")
    sch = [s["scheduler"] for s in samples]
    print(f"scheduler history (in the learner's process): spans {sch[0]['spans']} -> "
          f"{sch[-1]['spans']}, their task groups {sch[0]['span_groups']} -> "
          f"{sch[-1]['span_groups']}, tasks {sch[0]['tasks']} -> {sch[-1]['tasks']}")
    kinds: dict[str, int] = {}
    for f in ref["shm_files"]:
        kind = Path(f).name.split("-")[0] + "-*"
        kinds[kind] = kinds.get(kind, 0) + 1
    changed = set(samples[-1]["shm_files"]) ^ set(ref["shm_files"])
    print(f"  shm files at the end of the warm-up, by kind: {kinds}; {len(changed)} of them were "
          "replaced by others since (same count)" if changed and len(samples[-1]["shm_files"])
          == len(ref["shm_files"]) else f"  shm files at the end of the warm-up, by kind: {kinds}")
    return verdicts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=2000)
    p.add_argument("--every", type=int, default=100, help="sample every N batches")
    p.add_argument("--warmup", type=int, default=200,
                   help="batches before the reference sample (RSS grows while caches fill)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--envs-per-worker", type=int, default=4)
    p.add_argument("--frames-per-batch", type=int, default=128)
    p.add_argument("--update-every", type=int, default=5,
                   help="publish new weights every N batches (0: never)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    # A TMPDIR of the run's own, before anything reads it: the workers' scratch space, and any
    # temporary file of any process of the run, land in it.
    tmp = tempfile.mkdtemp(prefix="daskrl-soak-tmp-")
    os.environ["TMPDIR"] = tmp
    tempfile.tempdir = None
    store_dir = tempfile.mkdtemp(prefix="daskrl-soak-store-", dir=os.path.dirname(tmp))
    shm_before = set(os.listdir(SHM))

    import gymnasium as gym

    from daskrl import Collector
    from daskrl.policies import MLPPolicy

    env = gym.make("CartPole-v1")
    policy = MLPPolicy(env.observation_space, env.action_space)
    total = args.batches * args.frames_per_batch
    print(f"# soak: {args.batches} batches of {args.frames_per_batch} frames (CartPole-v1, "
          f"{args.envs_per_worker} envs per worker, {args.workers} workers, embedded cluster, "
          f"new weights every {args.update_every} batches); {os.cpu_count()} cores, load "
          f"average {os.getloadavg()[0]:.2f} at start")
    samples: list[dict[str, Any]] = []
    t0 = time.monotonic()
    with Collector("CartPole-v1", policy, f"{store_dir}/store", num_workers=args.workers,
                   envs_per_worker=args.envs_per_worker, frames_per_batch=args.frames_per_batch,
                   total_frames=total) as collector:
        samples.append(sample(collector, 0, tmp))
        for i, _handle in enumerate(collector, 1):
            if args.update_every and i % args.update_every == 0:
                collector.update_weights(policy)
            if i % args.every == 0 or i == args.batches:
                samples.append(sample(collector, i, tmp))
                s = samples[-1]
                print(f"  {i:>6} batches  {s['t'] - t0:7.1f} s  learner {s['learner_rss']:.0f} "
                      f"MiB {s['learner_fds']} fds  workers "
                      + ", ".join(f"{w['rss']:.0f} MiB {w['fds']} fds"
                                  for w in s["workers"].values())
                      + f"  shm {len(s['shm_files'])}  tmp {len(s['tmp_files'])}", flush=True)
        summary = collector.summary()
    wall = time.monotonic() - t0
    print(f"# {summary['batches']} batches, {summary['frames']} frames in {wall:.0f} s; "
          f"weights version {summary['weights_version']}")
    verdicts = report(samples, args.warmup)
    time.sleep(1.0)  # the nannies' worker processes are gone; let their trackers finish
    seen = set().union(*(set(s["shm_files"]) for s in samples))
    left_shm = sorted(f for f in seen if os.path.exists(f))  # the run's own, still named
    others = sorted(set(os.listdir(SHM)) - shm_before - {Path(f).name for f in seen})
    left_tmp = _files_under(tmp)
    print(f"\nafter close: /dev/shm files of the run (seen in a sample) still there: "
          f"{len(left_shm)} {left_shm[:10]}; new files of other programs: {len(others)}")
    print(f"after close: files left in the run's TMPDIR: {len(left_tmp)} {left_tmp[:10]}")
    ok = all(verdicts.values())
    print(f"\nverdict: {'every series flat/constant' if ok else 'growth found: ' + ', '.join(k for k, v in verdicts.items() if not v)}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"args": vars(args), "samples": samples, "verdicts": verdicts,
             "left_shm": left_shm, "left_tmp": left_tmp, "wall": wall}, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(store_dir, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
