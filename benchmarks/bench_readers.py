"""Reader throughput for learners: samples/s of the torch datasets against numpy in memory.

Writes a store of MuJoCo-like vector batches (``float32 [T=256, E=16, 17]`` observations and
next observations, ``[.., 6]`` actions, rewards, flags, ids; ~0.8 MiB per batch, 4096
transitions) with the default codec, then, in one run, reads minibatches of ``--minibatch``
transitions of five arrays (observation, action, reward, next_observation, terminated) in
shuffled order:

* ``numpy floor``: the same arrays already in RAM, one ``[N, ...]`` array each, fancy-indexed
  by the minibatch's indices and wrapped as tensors (no reading, no checks, no cache);
* ``item by item``: ``TransitionDataset`` read ``ds[i]`` per item then collated with
  ``default_collate`` (what ``DataLoader(ds, batch_size=n, shuffle=True)`` did before batched
  reads), every batch already cached (its best case);
* ``batched``: ``DataLoader(ds, sampler=BatchSampler(RandomSampler(ds), n), batch_size=None)``
  over a fresh dataset: epoch 1 reads and decodes every batch once, epoch 2 is all cached;
* ``batched, collated``: ``DataLoader(ds, batch_size=n, shuffle=True)`` (``__getitems__``,
  then ``default_collate``);
* ``ReplayDataset``: samples (``DataLoader(replay, batch_size=n)``) and minibatches
  (``batch_size=n`` on the dataset, ``DataLoader(replay, batch_size=None)``), with the default
  pool of 8 resident batches and with 1 (one batch per minibatch, as before), reading one batch
  per ``samples_per_batch=n`` samples.

All in one process, ``num_workers=0`` (the rates are per loader process).  Each timing is the
best of ``--repeats``; the ratios are against the floor measured in the same run.  On a shared
machine the numbers are noisy: run it several times and compare the spread.

Run:  python benchmarks/bench_readers.py [--batches 64] [--minibatch 256] [--repeats 3]
      [--item-only]  (the floor and item reads only: runs against earlier versions of daskrl)
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Callable

import numpy as np
import torch
from bench_store import vector_batch  # the same vector batches as the store benchmark
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, default_collate

import daskrl
from daskrl.store import TrajectoryStore

KEYS = ["observation", "action", "reward", "next_observation", "terminated"]


def _write(path: str, n: int) -> dict[str, np.ndarray]:
    """A store of ``n`` batches; returns the five arrays concatenated ``[N, ...]`` (the
    dataset's item order: batch, then time, then env)."""
    rng = np.random.default_rng(0)
    w = TrajectoryStore(path, read_only=False)
    w.initialize()
    flat: dict[str, list[np.ndarray]] = {k: [] for k in KEYS}
    for i in range(n):
        arrays = vector_batch(rng)
        T, E = arrays["reward"].shape
        w.write_batch(i, arrays, {"frames": T * E, "weights_version": 0, "worker": "bench",
                                  "device": "cpu", "episode_returns": [], "episode_lengths": [],
                                  "shape": [T, E]})
        for k in KEYS:
            flat[k].append(arrays[k].reshape(T * E, *arrays[k].shape[2:]))
    return {k: np.concatenate(v) for k, v in flat.items()}


def _rate(fn: Callable[[], int], repeats: int) -> float:
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        n = fn()
        best = max(best, n / (time.perf_counter() - t0))
    return best


def run(batches: int, minibatch: int, repeats: int, items: int, base: str,
        item_only: bool = False) -> list[dict]:
    url = f"{base}/store"
    floor_arrays = _write(url, batches)
    N = len(floor_arrays["reward"])
    perm = np.random.default_rng(1).permutation(N)
    rows: list[dict] = []

    def floor() -> int:
        for s in range(0, N, minibatch):
            idx = perm[s:s + minibatch]
            {k: torch.from_numpy(a[idx]) for k, a in floor_arrays.items()}
        return N

    hot = daskrl.TransitionDataset(url, KEYS, cache_batches=batches)
    for i in range(0, N, 4096):  # every batch cached: the item reads' best case
        hot[i]
    sub = perm[:items]

    def item_by_item() -> int:
        for s in range(0, len(sub), minibatch):
            default_collate([hot[int(i)] for i in sub[s:s + minibatch]])
        return len(sub)

    def epoch(loader: DataLoader) -> int:
        n = 0
        for b in loader:
            n += len(b["reward"])
        return n

    def batched_loader(ds: daskrl.TransitionDataset) -> DataLoader:
        return DataLoader(ds, sampler=BatchSampler(RandomSampler(ds), minibatch, drop_last=False),
                          batch_size=None)

    def batched_cold() -> int:  # a fresh dataset: every batch read and decoded once
        ds = daskrl.TransitionDataset(url, KEYS)
        n = epoch(batched_loader(ds))
        assert ds.cache.loads == batches
        return n

    warm = daskrl.TransitionDataset(url, KEYS)
    if not item_only:
        epoch(batched_loader(warm))

    def collated() -> int:
        return epoch(DataLoader(warm, batch_size=minibatch, shuffle=True))

    per_batch = sum(a.nbytes for a in floor_arrays.values()) // batches
    small = per_batch * batches // 4 + 1  # a cache of a quarter of the store
    reads: dict[str, float] = {}

    def grouped() -> int:  # a store 4x larger than the cache, each batch read once
        from daskrl.data import GroupShuffleSampler

        ds = daskrl.TransitionDataset(url, KEYS, cache_bytes=small)
        sampler = GroupShuffleSampler(ds, minibatch, resident_batches=max(1, batches // 8))
        n = epoch(DataLoader(ds, sampler=sampler, batch_size=None))
        reads["grouped"] = ds.cache.loads / batches
        return n

    def random_small() -> int:  # the same cache, uniform shuffling: 16 minibatches only
        ds = daskrl.TransitionDataset(url, KEYS, cache_bytes=small)
        n = 0
        for i, b in enumerate(batched_loader(ds)):
            n += len(b["reward"])
            if i == 15:
                break
        reads["random"] = ds.cache.loads / batches * (N / n)  # extrapolated to an epoch
        return n

    def replay(resident: int, stacked: bool) -> Callable[[], int]:
        total = 64 * minibatch

        def go() -> int:
            ds = daskrl.ReplayDataset(url, KEYS, samples_per_batch=minibatch, num_samples=total,
                                      resident_batches=resident,
                                      batch_size=minibatch if stacked else None)
            loader = DataLoader(ds, batch_size=None if stacked else minibatch)
            return epoch(loader)
        return go

    f = _rate(floor, repeats)
    measures = [
        ("numpy floor (in RAM)", f),
        ("TransitionDataset item by item", _rate(item_by_item, repeats)),
    ]
    if not item_only:
        measures += [
            ("TransitionDataset batched, epoch 1 (reads)", _rate(batched_cold, repeats)),
            ("TransitionDataset batched, cached", _rate(lambda: epoch(batched_loader(warm)), repeats)),
            ("TransitionDataset batched, collated", _rate(collated, repeats)),
            ("batched, cache 1/4 of store, GroupShuffleSampler", _rate(grouped, repeats)),
            ("batched, cache 1/4 of store, RandomSampler", _rate(random_small, repeats)),
            ("ReplayDataset samples, 8 resident", _rate(replay(8, False), repeats)),
            ("ReplayDataset minibatches, 8 resident", _rate(replay(8, True), repeats)),
            ("ReplayDataset minibatches, 1 resident", _rate(replay(1, True), repeats)),
        ]
    item = measures[1][1]
    for name, r in measures:
        rows.append({"reader": name, "samples_s": r, "vs_floor": r / f, "vs_item": r / item})
    for row in rows:
        if row["reader"].endswith("GroupShuffleSampler"):
            row["reads_per_batch_epoch"] = reads["grouped"]
        elif row["reader"].endswith("RandomSampler"):
            row["reads_per_batch_epoch"] = reads["random"]
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=64, help="batches of 4096 transitions")
    p.add_argument("--minibatch", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--items", type=int, default=16384, help="items read one by one")
    p.add_argument("--dir", default=None, help="directory for the store (default: tmp)")
    p.add_argument("--json", default=None, help="also write the rows as JSON here")
    p.add_argument("--item-only", action="store_true",
                   help="only the floor and item reads (runs against older daskrl versions too)")
    args = p.parse_args()
    base = tempfile.mkdtemp(prefix="daskrl-bench-readers-", dir=args.dir)
    try:
        rows = run(args.batches, args.minibatch, args.repeats, args.items, base, args.item_only)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"{args.batches} batches x 4096 transitions, minibatches of {args.minibatch}, "
          f"arrays {', '.join(KEYS)}; best of {args.repeats}")
    head = (f"{'reader':50s} {'samples/s':>11s} {'vs floor':>9s} {'vs item':>8s} "
            f"{'reads/batch/epoch':>17s}")
    print(head)
    print("-" * len(head))
    for r in rows:
        reads = r.get("reads_per_batch_epoch")
        print(f"{r['reader']:50s} {r['samples_s']:11.0f} {r['vs_floor']:9.3f} {r['vs_item']:8.1f} "
              f"{'' if reads is None else f'{reads:17.1f}'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
