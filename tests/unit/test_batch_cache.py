"""BatchCache alone: gathers equal plain indexing, whatever the waves, evictions and layouts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from daskrl import ConfigError
from daskrl.data._batch_cache import BatchCache


def _batch(bid: int, T: int = 4, E: int = 3, width: int = 2) -> dict[str, torch.Tensor]:
    base = torch.arange(T * E * width, dtype=torch.float32).view(T, E, width)
    return {"x": base + 1000 * bid, "flag": torch.full((T, E), bid % 2 == 1)}


def _cache(**kw) -> tuple[BatchCache, list[int]]:
    loads: list[int] = []

    def load(bid: int) -> dict[str, torch.Tensor]:
        loads.append(bid)
        return _batch(bid, width=3 if bid >= 100 else 2)

    kw.setdefault("max_batches", None)
    kw.setdefault("max_bytes", 2**30)
    kw.setdefault("most_batches", 6)
    return BatchCache(load, slot_rows=12, **kw), loads


def _want(bids, t, e, length=None):
    if length is None:
        return torch.stack([_batch(int(b))["x"][int(i), int(j)] for b, i, j in zip(bids, t, e)])
    return torch.stack([_batch(int(b))["x"][int(i):int(i) + length, int(j)]
                        for b, i, j in zip(bids, t, e)])


@pytest.mark.parametrize("max_batches", [None, 1, 2, 3])
@pytest.mark.parametrize("length", [None, 2])
def test_gather_in_waves_reads_each_batch_once_per_call(max_batches, length):
    cache, loads = _cache(max_batches=max_batches)
    rng = np.random.default_rng(0)
    n = 50
    bids = rng.integers(0, 6, n)
    t = rng.integers(0, 4 - (length or 1) + 1, n)
    e = rng.integers(0, 3, n)
    got = cache.gather(bids, t, e, length)
    assert torch.equal(got["x"], _want(bids, t, e, length))
    assert torch.equal(got["flag"][:, 0] if length else got["flag"], torch.from_numpy(bids % 2 == 1))
    assert sorted(loads) == sorted(set(bids.tolist()))  # once each, in waves
    assert max_batches is None or len(cache) <= max_batches
    assert cache.slots == (max_batches or 6)  # never more than the batches there are


def test_byte_bound_and_lru_order():
    per = 12 * (2 * 4 + 1)
    cache, loads = _cache(max_bytes=2 * per)
    for b in (0, 1, 0, 2):  # 1 is the least recently used when 2 comes
        cache.get(b)
    assert cache.slots == 2 and 1 not in cache and 0 in cache and 2 in cache
    assert cache.nbytes <= 2 * per and loads == [0, 1, 2]
    cache.drop(0)
    assert 0 not in cache and cache.nbytes == per


def test_other_layouts_are_kept_apart_and_refused_in_one_minibatch():
    cache, _ = _cache()
    a = cache.gather(np.array([0, 1]), np.array([0, 1]), np.array([0, 2]), None)
    b = cache.gather(np.array([100, 101]), np.array([3, 2]), np.array([1, 0]), None)
    assert a["x"].shape == (2, 2) and b["x"].shape == (2, 3)
    assert torch.equal(b["x"], torch.stack([_batch(100, width=3)["x"][3, 1],
                                            _batch(101, width=3)["x"][2, 0]]))
    with pytest.raises(ConfigError, match="whose 'x' differ"):
        cache.gather(np.array([0, 100]), np.array([0, 0]), np.array([0, 0]), None)
