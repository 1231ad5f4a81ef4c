"""An iterable ``torch.utils.data`` dataset over a store that samples forever (or
``num_samples``) from the batches committed *so far*, picking up new ones as workers commit
them: each ``DataLoader`` worker keeps a pool of decoded batches, draws each sample from one of
them, and replaces one batch of the pool every ``samples_per_batch`` samples.

Like :class:`~daskrl.data.TransitionDataset`, it takes a store URL or an open store, pickles as
URL + ``storage_options`` and opens the store lazily in each ``DataLoader`` worker process, and
gives a recurrent policy's batches as it does: ``policy_state`` the state before a sample's
first step, and a batch that stores it once sampled at ``t = 0`` only when ``keys`` names it
(left out otherwise).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from daskrl._nested import nest
from daskrl.data._batch_cache import BatchCache
from daskrl.data._source import StoreSource, check_count, first_rows, split
from daskrl.data._state import per_batch
from daskrl.errors import BatchNotFoundError, StoreError, StoreRecordWarning
from daskrl.store import EnvFilter, TrajectoryStore, env_matcher

__all__ = ["ReplayDataset"]


class ReplayDataset(IterableDataset):
    """Iterable dataset sampling transitions (or windows) from the batches committed so far.

    Each ``DataLoader`` worker keeps a pool of ``resident_batches`` decoded batches, drawn at
    random among those committed, and draws every sample from a batch of the pool chosen at
    random for that sample; after each ``samples_per_batch`` samples, the pool's oldest batch
    makes way for a newly drawn one.  So a minibatch mixes up to ``resident_batches`` batches,
    and a batch is read once per ``samples_per_batch`` samples.

    Parameters
    ----------
    store
        A store URL or path, or an open :class:`~daskrl.TrajectoryStore`.
    keys
        Arrays to return (default: all, but a ``policy_state`` stored once per batch).
    sequence_length
        None: one transition per sample; ``L``: windows of ``L`` steps of one env
        (``policy_state``: the state before a window's first step, ``[...]``).
    samples_per_batch
        Samples drawn per batch read (one batch of the pool is replaced after each
        ``samples_per_batch`` samples).
    num_samples
        Total samples per epoch, split across ``DataLoader`` workers; None: endless.
    window
        Sample only from the ``window`` newest batches (by id); None: from all.
    seed
        Root of the sampling streams: each ``DataLoader`` worker draws from ``seed`` and its
        torch worker seed (new every epoch, reproducible under ``torch.manual_seed``).
    wait_seconds
        How long to wait for a usable batch (the first, or the next after one could not be
        loaded) before raising :class:`~daskrl.StoreError`.  Committed batches that cannot be
        read (data missing or damaged) are skipped with a :class:`~daskrl.StoreRecordWarning`.
    storage_options
        For fsspec, with a URL (default: none; an open store brings its own).
    resident_batches
        Batches in each worker's pool (memory: that many decoded batches per worker; 1 draws
        every ``samples_per_batch`` samples from one batch).
    batch_size
        None: yield one sample at a time (use ``DataLoader(..., batch_size=n)``).  ``n``: yield
        minibatches of ``n`` samples, stacked (use ``DataLoader(..., batch_size=None)``).
    env
        Only the batches of these envs (as ``store.handles(env=...)``); default: every env.
    """

    def __init__(
        self,
        store: TrajectoryStore | str | os.PathLike[str],
        keys: Sequence[str] | None = None,
        *,
        sequence_length: int | None = None,
        samples_per_batch: int = 256,
        num_samples: int | None = None,
        window: int | None = None,
        seed: int = 0,
        wait_seconds: float = 60.0,
        storage_options: Mapping[str, Any] | None = None,
        resident_batches: int = 8,
        batch_size: int | None = None,
        env: EnvFilter = None,
    ) -> None:
        self._src = StoreSource(store, storage_options, keys, sequence_length)
        for name, v, none_ok in (("samples_per_batch", samples_per_batch, False),
                                 ("num_samples", num_samples, True), ("window", window, True),
                                 ("resident_batches", resident_batches, False),
                                 ("batch_size", batch_size, True)):
            check_count(name, v, none_ok)
        self.samples_per_batch = samples_per_batch
        self.num_samples = num_samples
        self.window = window
        self.seed = seed
        self.wait_seconds = wait_seconds
        self.resident_batches = resident_batches
        self.batch_size = batch_size
        self.env = env
        env_matcher(env, dict)  # a bad selector fails here, not in a loader worker
        self._epoch = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        quota = None
        if self.num_samples is not None:
            quota = self.num_samples // nw + (1 if wid < self.num_samples % nw else 0)
        # In a DataLoader worker, torch's per-worker seed changes every epoch and follows
        # torch.manual_seed; in the main process, count epochs.
        rng = np.random.default_rng([self.seed, info.seed if info is not None else self._epoch])
        self._epoch += 1
        pool = _Pool(self, rng, quota)
        produced = due = 0
        # Raise once no batch could be loaded for wait_seconds (before the first, or since the
        # last): batches that cannot be read are skipped, with a warning, never retried forever.
        deadline = time.monotonic() + self.wait_seconds
        while quota is None or produced < quota:
            rotate, due = divmod(due, self.samples_per_batch)
            if rotate or not pool.bids:  # the listing is read once per samples_per_batch
                pool.refresh(rotate)
            if not pool.bids:
                if time.monotonic() > deadline:
                    raise self._nothing_to_sample(self._src.length, pool.unreadable)
                time.sleep(0.2)
                continue
            deadline = time.monotonic() + self.wait_seconds
            n = self.batch_size or self.samples_per_batch
            n = n if quota is None else min(n, quota - produced)
            flat = pool.draw(n)
            if self.batch_size is not None:
                yield nest(flat)
            else:
                yield from split(flat)
            produced += n
            due += n

    def _nothing_to_sample(self, length: int, unreadable: Mapping[int, str]) -> StoreError:
        if unreadable:
            first = next(iter(unreadable.values()))
            return StoreError(
                f"no batch of {self._src.url!r} could be sampled for {self.wait_seconds:.0f}s: "
                f"{len(unreadable)} committed batch(es) {sorted(unreadable)[:10]} cannot be "
                f"read (first: {first})"
            )
        return StoreError(
            f"no batch with at least {length} steps appeared in {self._src.url!r} within "
            f"{self.wait_seconds:.0f}s; is a collector writing to it?"
        )


class _Pool:
    """One iteration's resident batches of a :class:`ReplayDataset` (oldest first)."""

    def __init__(self, ds: ReplayDataset, rng: np.random.Generator, quota: int | None) -> None:
        self.ds, self.rng = ds, rng
        self.store = ds._src.store()
        self.length = ds._src.length
        self.size = ds.resident_batches
        if quota is not None:  # a short epoch reads no more batches than before
            self.size = min(self.size, -(-quota // ds.samples_per_batch))
        self.bids: list[int] = []
        self.shapes: dict[int, tuple[int, int]] = {}
        self.unreadable: dict[int, str] = {}
        self.cache: BatchCache | None = None
        self.match = env_matcher(ds.env, self.store.runs)

    def _eligible(self) -> list[int]:
        recs = self.store.records()
        ids = [b for b in recs if int(recs[b]["shape"][0]) >= self.length
               and b not in self.unreadable and (self.match is None or self.match(recs[b]))]
        if self.ds.window is not None:
            ids = ids[-self.ds.window:]
        for b in ids:
            if b not in self.shapes:
                T, E = (int(n) for n in recs[b]["shape"])
                self.shapes[b] = (T, E)
                if per_batch(recs[b]):
                    self.ds._src.once.add(b)
        return ids

    def refresh(self, rotate: int) -> None:
        """Drop batches no longer eligible (deleted, out of the window), fill the pool, and
        replace its ``rotate`` oldest batches with new ones (where there are others)."""
        ids = self._eligible()
        eligible = set(ids)
        for b in [b for b in self.bids if b not in eligible]:
            self._drop(b)
        if self.cache is None and ids:
            self.cache = BatchCache(self.ds._src.load_flat,
                                    slot_rows=max(T * E for T, E in self.shapes.values()),
                                    max_batches=None, max_bytes=2**62, most_batches=self.size + 1)
        target = min(self.size, len(ids))
        wanted = target - len(self.bids) + min(rotate, len(self.bids))
        gone: set[int] = set()
        while wanted > 0:
            bid = self._pick(ids, gone)
            if bid is None:
                return
            try:
                assert self.cache is not None
                self.cache.get(bid)
            except BatchNotFoundError:  # deleted meanwhile (keep_last): pick another
                gone.add(bid)
                continue
            except StoreError as err:  # committed but unreadable: damaged, or data missing
                self.unreadable[bid] = str(err)
                warnings.warn(StoreRecordWarning(
                    f"ReplayDataset skips batch {bid}, which cannot be read: {err}"), stacklevel=4)
                continue
            if len(self.bids) >= target:
                self._drop(self.bids[0])
            self.bids.append(bid)
            wanted -= 1

    def _pick(self, ids: list[int], gone: set[int]) -> int | None:
        """A random eligible batch not in the pool (None if there is none)."""
        skip = set(self.bids) | gone | set(self.unreadable)
        for _ in range(8):  # most draws hit a batch outside the pool
            b = ids[int(self.rng.integers(len(ids)))]
            if b not in skip:
                return b
        rest = [b for b in ids if b not in skip]
        return rest[int(self.rng.integers(len(rest)))] if rest else None

    def _drop(self, bid: int) -> None:
        self.bids.remove(bid)
        if self.cache is not None:
            self.cache.drop(bid)

    def draw(self, n: int) -> dict[str, torch.Tensor]:
        """``n`` samples, each from a batch of the pool drawn for it."""
        assert self.cache is not None
        T, E = (np.array(v, np.int64) for v in zip(*(self.shapes[b] for b in self.bids)))
        which = self.rng.integers(len(self.bids), size=n)
        anywhere = np.array([self.ds._src.starts_anywhere(b) for b in self.bids])
        t = self.rng.integers(0, T[which] - self.length + 1) * anywhere[which]
        e = self.rng.integers(0, E[which])
        length = self.ds._src.sequence_length
        return first_rows(self.cache.gather(np.array(self.bids, np.int64)[which], t, e, length),
                          length)
