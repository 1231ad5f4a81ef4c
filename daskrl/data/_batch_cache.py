"""Decoded batches a dataset keeps in memory, and minibatches gathered from them.

A :class:`BatchCache` holds at most ``max_batches`` decoded batches and at most ``max_bytes``
of them (the least recently used go first).  Batches of the cache's main layout (the arrays,
trailing shapes and dtypes of the first batch loaded) are copied into one area per array,
``[slots * slot_rows, ...]``, allocated once and reused slot by slot, so that the rows of any
resident batches are gathered with one ``index_select`` per array.  A batch of another layout
(another env of the store, a batch larger than a slot) is kept as its own tensors.

Every batch comes from the ``load`` function the cache is given (the store's checked reading
path); the cache only copies what that returned.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import torch

from daskrl.errors import ConfigError

__all__ = ["BatchCache", "Resident", "batch_nbytes"]

Layout = tuple[tuple[str, tuple[int, ...], torch.dtype], ...]
"""Per array: name, trailing shape (after ``[T, E]``) and dtype."""


def _layout(flat: dict[str, torch.Tensor]) -> Layout:
    return tuple((k, tuple(v.shape[2:]), v.dtype) for k, v in flat.items())


def _row_bytes(layout: Layout) -> int:
    return sum(int(np.prod(s, dtype=np.int64)) * torch.empty(0, dtype=d).element_size()
               for _, s, d in layout)


def batch_nbytes(flat: dict[str, torch.Tensor]) -> int:
    """Bytes of a batch's tensors."""
    return sum(v.numel() * v.element_size() for v in flat.values())


@dataclasses.dataclass
class Resident:
    """One cached batch: ``arrays`` are ``[T, E, ...]`` (views of the shared area when ``base``
    is not None: its rows start at ``base``)."""

    bid: int
    T: int
    E: int
    arrays: dict[str, torch.Tensor]
    base: int | None
    nbytes: int


class BatchCache:
    """Least-recently-used cache of decoded batches (see the module's docstring).

    ``load(bid)`` returns a batch's arrays as ``{name: tensor [T, E, ...]}`` (flat names);
    ``slot_rows``: the most rows (``T * E``) a batch of the main layout has; ``most_batches``:
    the most batches there are to cache (a smaller area for a small dataset).
    """

    def __init__(self, load: Callable[[int], dict[str, torch.Tensor]], *, slot_rows: int,
                 max_batches: int | None, max_bytes: int, most_batches: int | None = None) -> None:
        self._load = load
        self.slot_rows = max(1, slot_rows)
        self.max_batches = max_batches
        self.max_bytes = max_bytes
        self._most = most_batches
        self._entries: collections.OrderedDict[int, Resident] = collections.OrderedDict()
        self._layout: Layout | None = None
        self._area: dict[str, torch.Tensor] = {}
        self._free: list[int] = []
        self._pinned: set[int] = set()
        self.slots = 0
        self.nbytes = 0
        self.loads = 0
        """Batches read from the store so far (a measure for tests and benchmarks)."""

    def __contains__(self, bid: int) -> bool:
        return bid in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, bid: int) -> Resident:
        """The batch ``bid``, loaded if it is not resident."""
        res = self._entries.get(bid)
        if res is not None:
            self._entries.move_to_end(bid)
            return res
        flat = self._load(bid)
        self.loads += 1
        first = next(iter(flat.values()), None)
        T, E = (int(n) for n in first.shape[:2]) if first is not None else (0, 0)
        layout = _layout(flat)
        if self._layout is None and flat:
            self._allocate(layout)
        if layout == self._layout and self.slot_rows >= T * E and (
                self._free or self._evict(lambda r: r.base is not None)):
            slot = self._free.pop()
            base = slot * self.slot_rows
            arrays = {}
            for k, v in flat.items():
                view = self._area[k][base:base + T * E].view(v.shape)
                # numpy's copy: torch's spreads a large copy over its intra-op threads, which
                # costs 100x more on a busy machine
                np.copyto(view.numpy(), v.numpy())
                arrays[k] = view
            res = Resident(bid, T, E, arrays, base, self._slot_bytes)
        else:  # another layout, or every slot holds a batch the current read needs
            res = Resident(bid, T, E, flat, None, batch_nbytes(flat))
        self._entries[bid] = res
        self.nbytes += res.nbytes
        while (self.max_batches is not None and len(self._entries) > self.max_batches) or (
                self.nbytes > self.max_bytes):
            if not self._evict(lambda r: r.bid != bid):
                break  # the rest is in use by the current read: dropped after it
        return res

    def drop(self, bid: int) -> None:
        """Forget the batch ``bid`` (if resident)."""
        res = self._entries.pop(bid, None)
        if res is not None:
            self._release(res)

    def _allocate(self, layout: Layout) -> None:
        self._layout = layout
        self._slot_bytes = self.slot_rows * max(1, _row_bytes(layout))
        slots = max(1, self.max_bytes // self._slot_bytes)
        for bound in (self.max_batches, self._most):
            if bound is not None:
                slots = min(slots, bound)
        self.slots = max(1, slots)
        # untouched pages cost no memory: a slot's pages are mapped when a batch first fills it
        self._area = {k: torch.empty((self.slots * self.slot_rows, *s), dtype=d)
                      for k, s, d in layout}
        self._free = list(range(self.slots - 1, -1, -1))

    def _evict(self, which: Callable[[Resident], bool]) -> bool:
        """Drop the least recently used batch that ``which`` accepts and the current read does
        not use; False if there is none."""
        for bid, res in self._entries.items():
            if bid not in self._pinned and which(res):
                del self._entries[bid]
                self._release(res)
                return True
        return False

    def _release(self, res: Resident) -> None:
        self.nbytes -= res.nbytes
        if res.base is not None:
            self._free.append(res.base // self.slot_rows)

    def gather(self, bids: np.ndarray, t: np.ndarray, e: np.ndarray,
               length: int | None) -> dict[str, torch.Tensor]:
        """Sample ``i`` is step ``t[i]`` (``length`` None) or steps ``t[i] .. t[i] + length - 1``
        of env ``e[i]`` of batch ``bids[i]``: ``{name: [n, ...]}`` or ``{name: [n, length,
        ...]}``.  Each distinct batch is read at most once per call (in waves of at most
        :attr:`slots` batches when more are asked for than the area holds)."""
        uniq, inverse = np.unique(bids, return_inverse=True)
        inverse = inverse.ravel()
        ids = uniq.tolist()
        hits = [self._entries.get(b) for b in ids]
        if all(r is not None and r.base is not None for r in hits):  # all resident, in the area
            for b in ids:
                self._entries.move_to_end(b)
            base = np.array([r.base for r in hits], np.int64)  # type: ignore[union-attr]
            envs = np.array([r.E for r in hits], np.int64)  # type: ignore[union-attr]
            return _Wave(self, inverse, t, e, length, base, envs, {}).flush(0, len(ids))
        base = np.full(len(uniq), -1, np.int64)
        envs = np.zeros(len(uniq), np.int64)
        loose: dict[int, Resident] = {}
        w = _Wave(self, inverse, t, e, length, base, envs, loose)
        start = in_area = 0
        try:
            for j, bid in enumerate(ids):
                if self.slots and in_area >= self.slots and bid not in self._entries:
                    w.flush(start, j)  # the area is full of this read's batches
                    self._pinned.clear()
                    start, in_area = j, 0
                res = self.get(bid)
                self._pinned.add(bid)
                envs[j] = res.E
                if res.base is None:
                    loose[j] = res
                else:
                    base[j] = res.base
                    in_area += 1
            return w.flush(start, len(uniq))
        finally:
            self._pinned.clear()


class _Wave:
    """The samples of one :meth:`BatchCache.gather`, gathered wave by wave into ``out``."""

    def __init__(self, cache: BatchCache, inverse: np.ndarray, t: np.ndarray, e: np.ndarray,
                 length: int | None, base: np.ndarray, envs: np.ndarray,
                 loose: dict[int, Resident]) -> None:
        self.cache, self.inverse, self.t, self.e = cache, inverse, t, e
        self.length, self.base, self.envs, self.loose = length, base, envs, loose
        self.steps = np.arange(1 if length is None else length, dtype=np.int64)
        self.out: dict[str, torch.Tensor] | None = None

    def _rows(self, sel: np.ndarray | slice, base: np.ndarray | int) -> torch.Tensor:
        E = self.envs[self.inverse[sel]]
        r = (self.t[sel] * E + self.e[sel] + base)[:, None] + E[:, None] * self.steps
        return torch.from_numpy(r.ravel())

    def _shaped(self, v: torch.Tensor, m: int) -> torch.Tensor:
        if self.length is None:
            return v
        return v.view(m, self.length, *v.shape[1:])

    def flush(self, j0: int, j1: int) -> dict[str, torch.Tensor]:
        """Gather the samples of distinct batches ``j0 .. j1 - 1`` (all resident, pinned)."""
        n = len(self.inverse)
        every = j0 == 0 and j1 == len(self.base)
        if every and not self.loose:  # one wave, all in the area: one gather per array
            idx = self._rows(slice(None), self.base[self.inverse])
            return {k: self._shaped(a.index_select(0, idx), n) for k, a in self.cache._area.items()}
        sel = np.arange(n) if every else np.flatnonzero((self.inverse >= j0) & (self.inverse < j1))
        groups: list[tuple[np.ndarray, dict[str, torch.Tensor]]] = []
        in_area = sel[self.base[self.inverse[sel]] >= 0]
        if len(in_area):
            idx = self._rows(in_area, self.base[self.inverse[in_area]])
            groups.append((in_area, {k: self._shaped(a.index_select(0, idx), len(in_area))
                                     for k, a in self.cache._area.items()}))
        for j in sorted(k for k in self.loose if j0 <= k < j1):
            res = self.loose[j]
            pos = sel[self.inverse[sel] == j]
            idx = self._rows(pos, 0)
            groups.append((pos, {k: self._shaped(v.reshape(res.T * res.E, *v.shape[2:])
                                                 .index_select(0, idx), len(pos))
                                 for k, v in res.arrays.items()}))
        if self.out is None and len(groups) == 1 and len(groups[0][0]) == n:
            return groups[0][1]  # one gather, in order: no copy
        bids = [self.loose[j].bid if j in self.loose else None for j in range(j0, j1)]
        for pos, part in groups:
            if self.out is None:
                self.out = {k: v.new_empty((n, *v.shape[1:])) for k, v in part.items()}
            _check_same(self.out, part, [b for b in bids if b is not None])
            where = torch.from_numpy(pos)
            for k, v in part.items():
                self.out[k].index_copy_(0, where, v)
        assert self.out is not None
        return self.out


def _check_same(out: dict[str, torch.Tensor], part: dict[str, torch.Tensor],
                others: Sequence[int]) -> None:
    bids = f"batches {sorted(others)[:4]} hold another layout" if others else "batches differ"
    if list(out) != list(part):
        raise ConfigError(
            f"a minibatch mixes batches with different arrays ({sorted(out)} and "
            f"{sorted(part)}; {bids}): read batches of one env (env=, batch_ids=) "
            "or pass keys= present in every batch.")
    for k, v in part.items():
        if v.shape[1:] != out[k].shape[1:] or v.dtype != out[k].dtype:
            raise ConfigError(
                f"a minibatch mixes batches whose {k!r} differ ({out[k].dtype} "
                f"{list(out[k].shape[1:])} and {v.dtype} {list(v.shape[1:])}; "
                f"{bids}): samples of different shapes cannot be stacked. Read batches "
                "of one env (env=, batch_ids=).")
