"""Soak: many small batches while workers are killed, then prove nothing was lost or doubled.

A collector runs ``--batches`` small batches of a deterministic env (``daskrl.testing.SlowEnv``,
a counting env whose transitions are checkable) on a ``--workers``-worker embedded cluster.
Every ``--kill-every`` handles one worker's process is killed with SIGKILL while batches run
on it (its nanny starts a new one). At the end the store is checked: exactly the expected batch
ids, total frames exact, every transition real, no transition stored twice, and every episode
continuous (``daskrl.testing.check_episode_continuity``: it starts at step 0 in the batch its id
names and runs on unbroken across its stream's batches, or is cut at a batch boundary).

Run:  python benchmarks/soak_faults.py [--batches 300] [--kill-every 40] [--workers 2]
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import tempfile
import time

import numpy as np
from distributed import Client

import daskrl
from daskrl.deploy import local_cluster
from daskrl.testing import SlowEnv, TagPolicy, check_episode_continuity


def verify(url: str, n_batches: int, frames: int) -> dict[str, int]:
    """Raise AssertionError unless the store holds exactly the expected, real data."""
    store = daskrl.open_store(url)
    ids = store.batch_ids()
    assert ids == list(range(n_batches)), f"batch ids: {len(ids)} of {n_batches}"
    assert store.frames == frames, (store.frames, frames)
    seen: dict[int, set[int]] = {}
    transitions = 0
    for bid in ids:
        b = store.load(bid)
        obs, nxt = b["observation"].numpy(), b["next_observation"].numpy()
        assert np.array_equal(nxt, obs + np.array([0, 1])), f"batch {bid}: a junk transition"
        for eid, step in zip(b["episode_id"].numpy().ravel(), b["step"].numpy().ravel()):
            steps = seen.setdefault(int(eid), set())
            assert int(step) not in steps, f"episode {eid} step {step} stored twice"
            steps.add(int(step))
            transitions += 1
    report = check_episode_continuity(store)
    return {"batches": len(ids), "transitions": transitions, "episodes": len(seen),
            "ended": report.ended, "cut": report.cut}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--kill-every", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--frames-per-batch", type=int, default=64)
    args = parser.parse_args()
    E = 4
    total = args.batches * args.frames_per_batch
    kills = 0
    in_flight_at_kill = 0
    t0 = time.perf_counter()
    with local_cluster(args.workers) as cluster, Client(cluster) as client, \
            tempfile.TemporaryDirectory() as tmp:
        url = f"{tmp}/soak"
        env = functools.partial(SlowEnv, 0.001)
        with daskrl.Collector(env, TagPolicy(), url, client=client, envs_per_worker=E,
                              frames_per_batch=args.frames_per_batch, total_frames=total,
                              rounds=False) as collector:
            for i, handle in enumerate(collector, 1):
                if i % args.kill_every:
                    continue
                victim = handle.worker
                if victim not in client.scheduler_info()["workers"]:
                    continue
                in_flight_at_kill += len(client.processing().get(victim, ()))
                pid = client.run(os.getpid, workers=[victim])[victim]
                os.kill(pid, signal.SIGKILL)
                kills += 1
            summary = collector.summary()
        checked = verify(url, args.batches, total)
        debris = daskrl.open_store(url, writable=True).collect_garbage(older_than=0)
    wall = time.perf_counter() - t0
    print(f"frames collected        {summary['frames']:>8} (expected {total})")
    print(f"batches handed over     {summary['batches']:>8} (expected {args.batches})")
    print(f"faults injected         {kills:>8} (worker processes killed with SIGKILL)")
    print(f"batches retried         {in_flight_at_kill:>8} (queued or running on a killed worker)")
    print(f"uncommitted debris      {len(debris.attempts) + len(debris.partial_files):>8} "
          "(attempts cut mid-write; removed by collect_garbage)")
    print(f"store check             {'ok':>8}: {checked['batches']} batches, "
          f"{checked['transitions']} transitions, {checked['episodes']} episodes "
          f"({checked['ended']} ended, {checked['cut']} cut or running), none lost or "
          "duplicated, every episode continuous")
    print(f"wall time               {wall:>8.1f} s")


if __name__ == "__main__":
    main()
