"""``torch.utils.data`` datasets over a store: a replay buffer backed by the shared filesystem.

* :class:`TransitionDataset` (map-style): every transition, or every ``sequence_length``-step
  window, of the batches committed when it was made; use it with a ``DataLoader`` and
  ``shuffle=True`` for epochs over a fixed set of batches.
* :class:`ReplayDataset` (iterable): samples forever (or ``num_samples``) from the batches
  committed *so far*, picking up new ones as workers commit them: each ``DataLoader`` worker
  loads one random batch at a time and draws ``samples_per_batch`` samples from it.

Both take a store URL (with its ``storage_options``, if it needs any) or an open
:class:`~daskrl.TrajectoryStore` (whose options they use), pickle as URL + ``storage_options``
and open the store lazily in each ``DataLoader`` worker process, so ``num_workers > 0`` loads in parallel.  Samples are ``{key: tensor}``: one
step ``[...]``, or ``[L, ...]`` with ``sequence_length=L`` (windows lie inside one batch and may
cross episode boundaries: mask with ``terminated | truncated``).
"""

from __future__ import annotations

import collections
import os
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from daskrl._nested import tree_map
from daskrl.errors import (
    BatchNotFoundError,
    ConfigError,
    DatasetIndexError,
    StoreError,
    StoreRecordWarning,
)
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

    def sample(self, batch: Mapping[str, Any], t: int, e: int) -> dict[str, Any]:
        # nested for the arrays of a Dict or Tuple space and of info, as load gives them
        if self.sequence_length is None:
            return tree_map(lambda v: v[t, e].clone(), dict(batch))
        return tree_map(lambda v: v[t:t + self.length, e].clone(), dict(batch))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_store"] = None
        return state


class TransitionDataset(Dataset):
    """Map-style dataset of the transitions (or windows) of a store's committed batches.

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
    storage_options
        For fsspec, with a URL (default: none; an open store brings its own).
    cache_batches
        Batches each process keeps loaded (least recently used go first).

    Items are ordered by batch id, then time, then env: item ``i`` of a batch ``[T, E]`` is
    ``(t, e) = divmod(i, E)``.  Random access loads the batch holding the item, so shuffled
    loading reads each batch about ``len / (cache_batches * batches)`` times; for a large store
    sample with :class:`ReplayDataset` instead.
    """

    def __init__(
        self,
        store: TrajectoryStore | str | os.PathLike[str],
        keys: Sequence[str] | None = None,
        *,
        sequence_length: int | None = None,
        batch_ids: Sequence[int] | None = None,
        storage_options: Mapping[str, Any] | None = None,
        cache_batches: int = 4,
    ) -> None:
        self._src = _StoreSource(store, storage_options, keys, sequence_length)
        if isinstance(cache_batches, bool) or not isinstance(cache_batches, int) or cache_batches < 1:
            raise ConfigError(f"cache_batches must be an integer >= 1, got {cache_batches!r}.")
        self.cache_batches = cache_batches
        records = self._src.store().records()
        ids = sorted(records) if batch_ids is None else list(batch_ids)
        missing = [b for b in ids if b not in records]
        if missing:
            raise BatchNotFoundError(f"no committed batches {missing} in store {self._src.url!r}.")
        L = self._src.length
        shapes = [tuple(int(n) for n in records[b]["shape"]) for b in ids]
        counts = [max(0, T - L + 1) * E for T, E in shapes]
        self.batch_ids = ids
        self._envs = np.array([E for _, E in shapes], np.int64)
        self._starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        self._cache: collections.OrderedDict[int, dict[str, torch.Tensor]] = collections.OrderedDict()

    def __len__(self) -> int:
        return int(self._starts[-1])

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

    def _batch(self, bid: int) -> dict[str, torch.Tensor]:
        batch = self._cache.get(bid)
        if batch is None:
            batch = self._src.store().load(bid, keys=self._src.keys)
            self._cache[bid] = batch
            while len(self._cache) > self.cache_batches:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(bid)
        return batch

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        bid, t, e = self.locate(index)
        return self._src.sample(self._batch(bid), t, e)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache"] = collections.OrderedDict()
        return state


class ReplayDataset(IterableDataset):
    """Iterable dataset sampling transitions (or windows) from the batches committed so far.

    Parameters
    ----------
    store
        A store URL or path, or an open :class:`~daskrl.TrajectoryStore`.
    keys
        Arrays to return (default: all).
    sequence_length
        None: one transition per sample; ``L``: windows of ``L`` steps of one env.
    samples_per_batch
        Samples drawn (uniformly, with replacement) from each batch loaded.
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
    ) -> None:
        self._src = _StoreSource(store, storage_options, keys, sequence_length)
        for name, v, none_ok in (("samples_per_batch", samples_per_batch, False),
                                 ("num_samples", num_samples, True), ("window", window, True)):
            if (v is None and not none_ok) or (
                v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1)
            ):
                raise ConfigError(f"{name} must be an integer >= 1{' or None' if none_ok else ''},"
                                  f" got {v!r}.")
        self.samples_per_batch = samples_per_batch
        self.num_samples = num_samples
        self.window = window
        self.seed = seed
        self.wait_seconds = wait_seconds
        self._epoch = 0

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        quota = None
        if self.num_samples is not None:
            quota = self.num_samples // nw + (1 if wid < self.num_samples % nw else 0)
        # In a DataLoader worker, torch's per-worker seed changes every epoch and follows
        # torch.manual_seed; in the main process, count epochs.
        rng = np.random.default_rng([self.seed, info.seed if info is not None else self._epoch])
        self._epoch += 1
        store = self._src.store()
        L = self._src.length
        produced = 0
        # Raise once no batch could be loaded for wait_seconds (before the first, or since the
        # last): batches that cannot be read are skipped, with a warning, never retried forever.
        deadline = time.monotonic() + self.wait_seconds
        unreadable: dict[int, str] = {}
        while quota is None or produced < quota:
            recs = store.records()
            ids = [b for b in recs if int(recs[b]["shape"][0]) >= L and b not in unreadable]
            if self.window is not None:
                ids = ids[-self.window:]
            if not ids:
                if time.monotonic() > deadline:
                    raise self._nothing_to_sample(L, unreadable)
                time.sleep(0.2)
                continue
            bid = ids[int(rng.integers(len(ids)))]
            try:
                batch = store.load(bid, keys=self._src.keys)
            except BatchNotFoundError:  # deleted meanwhile (keep_last): pick another
                if time.monotonic() > deadline:
                    raise self._nothing_to_sample(L, unreadable) from None
                continue
            except StoreError as err:  # committed but unreadable: damaged, or data missing
                unreadable[bid] = str(err)
                warnings.warn(StoreRecordWarning(
                    f"ReplayDataset skips batch {bid}, which cannot be read: {err}"), stacklevel=2)
                continue
            deadline = time.monotonic() + self.wait_seconds
            T, E = (int(n) for n in recs[bid]["shape"])
            n = self.samples_per_batch if quota is None else min(self.samples_per_batch,
                                                                  quota - produced)
            ts = rng.integers(0, T - L + 1, n)
            es = rng.integers(0, E, n)
            for t, e in zip(ts.tolist(), es.tolist()):
                yield self._src.sample(batch, t, e)
            produced += n

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
