"""``torch.utils.data`` datasets over a store: a replay buffer backed by the shared filesystem.

* :class:`TransitionDataset` (map-style): every transition, or every ``sequence_length``-step
  window, of the batches committed when it was made, for epochs over a fixed set of batches;
  read whole minibatches (``DataLoader(ds, sampler=BatchSampler(...), batch_size=None)``, or
  :class:`~daskrl.store.GroupShuffleSampler` for a store larger than the cache), each batch
  they need read once, through a bounded cache of decoded batches (:mod:`._batch_cache`).
* :class:`ReplayDataset` (iterable): samples forever (or ``num_samples``) from the batches
  committed *so far*, picking up new ones as workers commit them: each ``DataLoader`` worker
  keeps a pool of decoded batches, draws each sample from one of them, and replaces one batch
  of the pool every ``samples_per_batch`` samples.

Both take a store URL (with its ``storage_options``, if it needs any) or an open
:class:`~daskrl.TrajectoryStore` (whose options they use), pickle as URL + ``storage_options``
and open the store lazily in each ``DataLoader`` worker process, so ``num_workers > 0`` loads in parallel.  Samples are ``{key: tensor}``: one
step ``[...]``, or ``[L, ...]`` with ``sequence_length=L`` (windows lie inside one batch and may
cross episode boundaries: mask with ``terminated | truncated``).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from daskrl._nested import nest
from daskrl.errors import (
    BatchNotFoundError,
    ConfigError,
    DatasetIndexError,
    StoreError,
    StoreRecordWarning,
)
from daskrl.store._batch_cache import BatchCache
from daskrl.store._env_select import EnvFilter, env_matcher
from daskrl.store._store import TrajectoryStore, open_store
from daskrl.store._url import normalize_url

__all__ = ["ReplayDataset", "TransitionDataset"]


def _check_length(sequence_length: int | None) -> int:
    if sequence_length is None:
        return 1
    if isinstance(sequence_length, bool) or not isinstance(sequence_length, int) or sequence_length < 1:
        raise ConfigError(f"sequence_length must be an integer >= 1 or None, got {sequence_length!r}.")
    return sequence_length


class _StoreSource:
    """URL + options; opens the store once per process."""

    def __init__(self, store: TrajectoryStore | str | os.PathLike[str],
                 storage_options: Mapping[str, Any] | None,
                 keys: Sequence[str] | None, sequence_length: int | None) -> None:
        if isinstance(store, TrajectoryStore):
            self.url = store.url
            self.options = dict(storage_options or store.storage_options)
        else:
            self.url = normalize_url(store)
            self.options = dict(storage_options or {})
        self.keys = list(keys) if keys is not None else None
        self.sequence_length = sequence_length
        self.length = _check_length(sequence_length)
        self._store: TrajectoryStore | None = None
        self._pid = -1

    def store(self) -> TrajectoryStore:
        if self._store is None or self._pid != os.getpid():
            self._store = open_store(self.url, self.options)
            self._pid = os.getpid()
        return self._store

    def load_flat(self, bid: int) -> dict[str, torch.Tensor]:
        """Batch ``bid``'s arrays by flat name, read through the store's checked path."""
        return self.store()._load_flat(bid, None, self.keys)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_store"] = None
        return state


class TransitionDataset(Dataset):
    """Map-style dataset of the transitions (or windows) of a store's committed batches.

    Items are ordered by batch id, then time, then env: item ``i`` of a batch ``[T, E]`` is
    ``(t, e) = divmod(i, E)``.  ``dataset[i]`` reads one item; ``dataset[[i, j, ...]]``,
    :meth:`get_batch` and ``__getitems__`` (which a ``DataLoader`` with ``batch_size=`` calls)
    read a whole minibatch, each batch it needs once (see docs/reading.md).

    Parameters
    ----------
    store
        A store URL or path, or an open :class:`~daskrl.TrajectoryStore`.
    keys
        Arrays to return (default: all).
    sequence_length
        None: item ``i`` is one transition ``{key: [...]}``.  ``L``: a window of ``L`` steps
        of one env inside one batch, ``{key: [L, ...]}``.
    batch_ids
        Batches to cover (default: all committed now).
    env
        Only the batches of these envs (an index, a label, or a collection of them; see
        ``store.handles(env=...)``); default: every env.
    storage_options
        For fsspec, with a URL (default: none; an open store brings its own).
    cache_batches
        Most batches each process keeps decoded (default: as many as ``cache_bytes`` holds).
    cache_bytes
        Most bytes of decoded batches each process keeps (default 1 GiB; at least one batch
        is always kept).  The least recently used batches go first.
    """

    def __init__(
        self,
        store: TrajectoryStore | str | os.PathLike[str],
        keys: Sequence[str] | None = None,
        *,
        sequence_length: int | None = None,
        batch_ids: Sequence[int] | None = None,
        env: EnvFilter = None,
        storage_options: Mapping[str, Any] | None = None,
        cache_batches: int | None = None,
        cache_bytes: int = 2**30,
    ) -> None:
        self._src = _StoreSource(store, storage_options, keys, sequence_length)
        for name, v, none_ok in (("cache_batches", cache_batches, True),
                                 ("cache_bytes", cache_bytes, False)):
            _check_count(name, v, none_ok)
        self.cache_batches = cache_batches
        self.cache_bytes = cache_bytes
        opened = self._src.store()
        records = opened.records()
        ids = sorted(records) if batch_ids is None else list(batch_ids)
        missing = [b for b in ids if b not in records]
        if missing:
            raise BatchNotFoundError(f"no committed batches {missing} in store {self._src.url!r}.")
        match = env_matcher(env, opened.runs)
        if match is not None:
            ids = [b for b in ids if match(records[b])]
        L = self._src.length
        shapes = [tuple(int(n) for n in records[b]["shape"]) for b in ids]
        counts = [max(0, T - L + 1) * E for T, E in shapes]
        self.batch_ids = ids
        self._ids = np.array(ids, np.int64)
        self._envs = np.array([max(1, E) for _, E in shapes], np.int64)
        self._starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        self._slot_rows = max([T * E for (T, E), c in zip(shapes, counts) if c] or [1])
        self._with_items = sum(1 for c in counts if c)
        self._cache: BatchCache | None = None

    def __len__(self) -> int:
        return int(self._starts[-1])

    @property
    def cache(self) -> BatchCache:
        """This process's cache of decoded batches."""
        if self._cache is None:
            self._cache = BatchCache(self._src.load_flat, slot_rows=self._slot_rows,
                                     max_batches=self.cache_batches, max_bytes=self.cache_bytes,
                                     most_batches=self._with_items)
        return self._cache

    def locate(self, index: int) -> tuple[int, int, int]:
        """``(batch_id, t, e)`` of item ``index``."""
        n = len(self)
        i = int(index)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise DatasetIndexError(f"index {index} out of range for a dataset of {n} items.")
        b = int(np.searchsorted(self._starts, i, side="right")) - 1
        t, e = divmod(i - int(self._starts[b]), int(self._envs[b]))
        return self.batch_ids[b], t, e

    def _positions(self, indices: Sequence[int] | np.ndarray | torch.Tensor,
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if isinstance(indices, torch.Tensor):
            indices = indices.numpy(force=True)
        idx = np.asarray(indices)
        if idx.ndim != 1 or not (idx.dtype.kind in "iu" or idx.size == 0):
            raise DatasetIndexError(
                f"a minibatch is a 1-d sequence of integer indices, got an array of shape "
                f"{list(idx.shape)} and dtype {idx.dtype}.")
        if idx.size == 0:
            raise DatasetIndexError("a minibatch needs at least one index, got none.")
        n = len(self)
        idx = idx.astype(np.int64)
        idx = np.where(idx < 0, idx + n, idx)
        bad = np.flatnonzero((idx < 0) | (idx >= n))
        if len(bad):
            raise DatasetIndexError(f"index {np.asarray(indices)[bad[0]]} out of range for a "
                                    f"dataset of {n} items.")
        b = np.searchsorted(self._starts, idx, side="right") - 1
        t, e = np.divmod(idx - self._starts[b], self._envs[b])
        return self._ids[b], t, e

    def get_batch(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> dict[str, Any]:
        """Items ``indices`` stacked: ``{key: [n, ...]}`` (``[n, L, ...]`` for windows), nested
        as items are.  Each batch the items lie in is read once (none if it is cached)."""
        bids, t, e = self._positions(indices)
        return nest(self.cache.gather(bids, t, e, self._src.sequence_length))

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Items ``indices``, read as by :meth:`get_batch` (a ``DataLoader``'s fetcher calls
        this for a minibatch, then collates the items)."""
        return _split(self.cache.gather(*self._positions(indices), self._src.sequence_length))

    def __getitem__(self, index: Any) -> dict[str, Any]:
        if isinstance(index, (int, np.integer)) or (
                isinstance(index, torch.Tensor) and index.ndim == 0):
            bid, t, e = self.locate(int(index))
            arrays = self.cache.get(bid).arrays
            L = self._src.length
            if self._src.sequence_length is None:
                return nest({k: v[t, e].clone() for k, v in arrays.items()})
            return nest({k: v[t:t + L, e].clone() for k, v in arrays.items()})
        return self.get_batch(index)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache"] = None
        return state


class ReplayDataset(IterableDataset):
    """Iterable dataset sampling transitions (or windows) from the batches committed so far.

    Each ``DataLoader`` worker keeps a pool of ``resident_batches`` decoded batches, drawn at
    random among those committed, and draws every sample from a batch of the pool chosen at
    random for that sample; after each ``samples_per_batch`` samples, the pool's oldest batch
    makes way for a newly drawn one.  So a minibatch mixes up to ``resident_batches`` batches,
    and a batch is read once per ``samples_per_batch`` samples, as before.

    Parameters
    ----------
    store
        A store URL or path, or an open :class:`~daskrl.TrajectoryStore`.
    keys
        Arrays to return (default: all).
    sequence_length
        None: one transition per sample; ``L``: windows of ``L`` steps of one env.
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
        self._src = _StoreSource(store, storage_options, keys, sequence_length)
        for name, v, none_ok in (("samples_per_batch", samples_per_batch, False),
                                 ("num_samples", num_samples, True), ("window", window, True),
                                 ("resident_batches", resident_batches, False),
                                 ("batch_size", batch_size, True)):
            _check_count(name, v, none_ok)
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
                yield from _split(flat)
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
        t = self.rng.integers(0, T[which] - self.length + 1)
        e = self.rng.integers(0, E[which])
        return self.cache.gather(np.array(self.bids, np.int64)[which], t, e,
                                 self.ds._src.sequence_length)


def _check_count(name: str, v: Any, none_ok: bool) -> None:
    if (v is None and not none_ok) or (
            v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1)):
        raise ConfigError(f"{name} must be an integer >= 1{' or None' if none_ok else ''}, "
                          f"got {v!r}.")


def _split(flat: Mapping[str, torch.Tensor]) -> list[dict[str, Any]]:
    """The samples of a stacked minibatch, each nested as an item is (views of ``flat``)."""
    columns = {k: v.unbind(0) for k, v in flat.items()}
    n = len(next(iter(columns.values()), ()))
    return [nest({k: c[i] for k, c in columns.items()}) for i in range(n)]
