"""A map-style ``torch.utils.data`` dataset over a store: every transition, or every
``sequence_length``-step window, of the batches committed when it was made, for epochs over a
fixed set of batches.

Read whole minibatches (``DataLoader(ds, sampler=BatchSampler(...), batch_size=None)``, or
:class:`~daskrl.data.GroupShuffleSampler` for a store larger than the cache): each batch they
need is read once, through a bounded cache of decoded batches (:mod:`._batch_cache`).  The
dataset takes a store URL (with its ``storage_options``, if it needs any) or an open
:class:`~daskrl.TrajectoryStore` (whose options it uses), pickles as URL + ``storage_options``
and opens the store lazily in each ``DataLoader`` worker process, so ``num_workers > 0`` loads
in parallel.  Samples are ``{key: tensor}``: one step ``[...]``, or ``[L, ...]`` with
``sequence_length=L`` (windows lie inside one batch and may cross episode boundaries: mask
with ``terminated | truncated``).

Batches of a recurrent policy: ``is_init`` comes as any array (``[L]``: where to reset the
state inside a window), and ``policy_state`` as the state before the sample's first step,
``[...]`` (no ``L`` axis), so a learner replays each window from it.  Stored before every
step, it is there for every sample.  Stored once per batch (the default,
``store_policy_state="first"``), it is the state before ``t = 0`` only: such a batch's state
is left out unless ``keys`` names it, and then its samples start at ``t = 0`` only (one per
env and batch).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from daskrl._nested import nest
from daskrl.data._batch_cache import BatchCache
from daskrl.data._source import StoreSource, check_count, first_rows, split
from daskrl.data._state import is_state, per_batch
from daskrl.errors import BatchNotFoundError, DatasetIndexError
from daskrl.store import EnvFilter, TrajectoryStore, env_matcher

__all__ = ["TransitionDataset"]


class TransitionDataset(Dataset):
    """Map-style dataset of the transitions (or windows) of a store's committed batches.

    Items are ordered by batch id, then time, then env: item ``i`` of a batch ``[T, E]`` is
    ``(t, e) = divmod(i, E)`` (a batch whose ``policy_state`` is stored once and named by
    ``keys`` has items at ``t = 0`` only: ``E`` of them, see the module's docstring).  ``dataset[i]`` reads one item; ``dataset[[i, j, ...]]``,
    :meth:`get_batch` and ``__getitems__`` (which a ``DataLoader`` with ``batch_size=`` calls)
    read a whole minibatch, each batch it needs once (see docs/reading.md).

    Parameters
    ----------
    store
        A store URL or path, or an open :class:`~daskrl.TrajectoryStore`.
    keys
        Arrays to return (default: all, but a ``policy_state`` stored once per batch).
    sequence_length
        None: item ``i`` is one transition ``{key: [...]}``.  ``L``: a window of ``L`` steps
        of one env inside one batch, ``{key: [L, ...]}`` (``policy_state``: ``[...]``, the
        state before its first step).
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
        self._src = StoreSource(store, storage_options, keys, sequence_length)
        for name, v, none_ok in (("cache_batches", cache_batches, True),
                                 ("cache_bytes", cache_bytes, False)):
            check_count(name, v, none_ok)
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
        self._src.once = {b for b in ids if per_batch(records[b])}
        shapes = [tuple(int(n) for n in records[b]["shape"]) for b in ids]
        counts = [max(0, T - L + 1) * E if self._src.starts_anywhere(b) else E * (T >= L)
                  for b, (T, E) in zip(ids, shapes)]
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
        return nest(self._gather(indices))

    def _gather(self, indices: Sequence[int] | np.ndarray | torch.Tensor,
                ) -> dict[str, torch.Tensor]:
        length = self._src.sequence_length
        return first_rows(self.cache.gather(*self._positions(indices), length), length)

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Items ``indices``, read as by :meth:`get_batch` (a ``DataLoader``'s fetcher calls
        this for a minibatch, then collates the items)."""
        return split(self._gather(indices))

    def __getitem__(self, index: Any) -> dict[str, Any]:
        if isinstance(index, (int, np.integer)) or (
                isinstance(index, torch.Tensor) and index.ndim == 0):
            bid, t, e = self.locate(int(index))
            arrays = self.cache.get(bid).arrays
            L = self._src.length
            if self._src.sequence_length is None:
                return nest({k: v[t, e].clone() for k, v in arrays.items()})
            return nest({k: (v[t, e] if is_state(k) else v[t:t + L, e]).clone()
                         for k, v in arrays.items()})
        return self.get_batch(index)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache"] = None
        return state
