"""The scaling model of ``docs/scaling.md``, fitted to ``bench_scale.py`` JSON files.

Each collection run of ``bench_scale.py`` gives, for one worker count N, the batches, the wall
time and the scheduler's and the learner's CPU. Runs with different batch durations (e.g. 4096-
and 16384-frame batches) separate a cost per batch from a cost per second of collection (the
collector's health checks while it waits, heartbeats): least squares of

    cpu = per_batch * batches + per_second * wall + per_heartbeat * H(N) * wall

with H(N) the worker heartbeats per second Dask's scheduler asks for (:func:`heartbeats_per_s`)

over every run given. Then the model: at ``--frames-per-worker-s`` frames/s per worker and
``--frames-per-batch`` frames per batch, the workers at which each reaches one core, and both
at ``--target-workers``.

Run:  python benchmarks/scale_model.py scale-4096.json scale-16384.json [...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def heartbeats_per_s(n: int) -> float:
    """Worker heartbeats per second the Dask scheduler asks for, with ``n`` workers."""
    if n <= 10:
        return n / 0.5
    if n < 50:
        return n / 1.0
    if n < 200:
        return n / 2.0
    return n / (n / 200 + 1)


def cores(model: tuple[float, float, float], n: int) -> float:
    """CPU cores at ``n`` workers of ``model`` = (per worker-second, per second, per heartbeat)."""
    per_worker, per_s, per_hb = model
    return per_worker * n + per_s + per_hb * heartbeats_per_s(n)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json", nargs="+")
    p.add_argument("--frames-per-worker-s", type=float, default=34_000.0,
                   help="one worker's rollout frames/s (CartPole, issue 14: 34k)")
    p.add_argument("--frames-per-batch", type=float, default=4096)
    p.add_argument("--target-workers", type=int, default=1000)
    args = p.parse_args()
    runs = [r for path in args.json for r in json.loads(Path(path).read_text())["collect"]]
    X = np.array([[r["batches"], r["wall_s"], heartbeats_per_s(r["workers"]) * r["wall_s"]]
                  for r in runs])
    f, F, n_t = args.frames_per_worker_s, args.frames_per_batch, args.target_workers
    for who, key in (("scheduler", "scheduler_cpu_ms_per_batch"),
                     ("learner", "learner_cpu_ms_per_batch")):
        y = np.array([r[key] * r["batches"] / 1e3 for r in runs])
        coef, *_ = np.linalg.lstsq(X, y, rcond=None)
        per_batch, per_s, per_hb = (float(c) for c in coef)
        resid = y - X @ coef
        print(f"{who}: {per_batch * 1e3:.2f} ms per batch + {per_s * 1e3:.2f} ms/s "
              f"+ {per_hb * 1e3:.3f} ms per heartbeat  (rms residual "
              f"{np.sqrt(np.mean(resid ** 2)) * 1e3:.0f} ms over {len(runs)} runs)")
        rate = f / F  # batches/s per worker
        model = (per_batch * rate, per_s, per_hb)
        sat = next((n for n in range(1, 100_000) if cores(model, n) >= 1), float("inf"))
        at = cores(model, n_t)
        print(f"  at {f:,.0f} frames/s per worker and {F:,.0f}-frame batches "
              f"({rate:.2f} batches/s per worker): one core at N = {sat:,.0f} workers; "
              f"{at:,.2f} cores at N = {n_t:,}")
        budget = 0.25 - per_s - per_hb * heartbeats_per_s(n_t)
        if per_batch > 0 and budget > 0:
            batches_s = budget / per_batch
            print(f"  a quarter core at N = {n_t:,} allows {batches_s:,.1f} batches/s: "
                  f"{n_t * f / batches_s:,.0f} frames per scheduler task/handle "
                  f"({n_t / batches_s:,.1f} s of one worker's rollout)")
    print(f"heartbeats at N = {n_t:,}: {heartbeats_per_s(n_t):,.0f}/s "
          f"(at 100 one-per-host workers: {heartbeats_per_s(100):,.0f}/s)")


if __name__ == "__main__":
    main()
