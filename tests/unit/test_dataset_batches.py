"""Batched reads of the torch datasets on stores written directly, in this process: minibatches
of arrays of different shapes refused, ReplayDataset minibatches mixing batches and following
new ones, the group-shuffle sampler's reads, and reads that stay on the store's checked path.
Over a store written by real collectors, and through DataLoader worker processes:
tests/test_dataset_batches.py."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from tagged_stores import check_real as _check_real
from tagged_stores import tagged_store as _tagged_store
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

import daskrl
from daskrl import ConfigError
from daskrl.data import GroupShuffleSampler
from daskrl.store import TrajectoryStore


def test_minibatches_of_arrays_of_different_shapes_are_refused(tmp_path):
    url = str(tmp_path / "s")
    w = TrajectoryStore(url, read_only=False)
    w.initialize()
    for b, width in ((0, 3), (1, 4)):
        w.write_batch(b, {"observation": np.full((2, 2, width), b, np.float32),
                          "reward": np.zeros((2, 2), np.float32)},
                      {"frames": 4, "weights_version": 0, "worker": "w", "device": "cpu",
                       "episode_returns": [], "episode_lengths": [], "shape": [2, 2]})
    ds = daskrl.TransitionDataset(url)
    with pytest.raises(ConfigError, match=re.escape(
            "a minibatch mixes batches whose 'observation' differ (torch.float32 [3] and "
            "torch.float32 [4]; batches [1] hold another layout)")):
        ds.get_batch([0, 4])
    assert torch.equal(ds.get_batch([5, 6])["observation"], torch.ones(2, 4))
    assert torch.equal(ds[4]["observation"], torch.ones(4))
    assert torch.equal(daskrl.TransitionDataset(url, ["reward"]).get_batch([0, 4])["reward"],
                       torch.zeros(2))


def test_replay_minibatches_mix_batches_and_stay_real(tmp_path):
    url = str(tmp_path / "s")
    _tagged_store(url, 12)
    # samples_per_batch=64 and minibatches of 64: before, each minibatch was one batch's
    ds = daskrl.ReplayDataset(url, ["origin", "value"], samples_per_batch=64, num_samples=64 * 40,
                              seed=3)
    batches = list(DataLoader(ds, batch_size=64))
    assert len(batches) == 40
    mixes = [len(set(b["origin"].tolist())) for b in batches]
    assert min(mixes) >= 2 and np.mean(mixes) >= 6  # 8 resident batches (each 1/8 of a draw)
    for b in batches:
        _check_real(b["origin"], b["value"])
    assert len({o for b in batches for o in b["origin"].tolist()}) >= 10  # the pool rotates
    # seeded: the same seed draws the same samples; another seed others
    again = list(DataLoader(daskrl.ReplayDataset(url, ["origin", "value"], samples_per_batch=64,
                                                 num_samples=64 * 40, seed=3), batch_size=64))
    assert all(torch.equal(a["value"], b["value"]) for a, b in zip(batches, again))
    other = list(daskrl.ReplayDataset(url, ["value"], samples_per_batch=64, num_samples=64, seed=4))
    assert not torch.equal(torch.stack([s["value"] for s in other]), batches[0]["value"])
    # one resident batch: each samples_per_batch samples from one batch, as before
    single = list(DataLoader(daskrl.ReplayDataset(url, ["origin"], samples_per_batch=64,
                                                  num_samples=64 * 5, resident_batches=1),
                             batch_size=64))
    assert [len(set(b["origin"].tolist())) for b in single] == [1] * 5


def test_reads_go_through_the_stores_checks(tmp_path):
    url = str(tmp_path / "s")
    _tagged_store(url, 4)
    ds = daskrl.TransitionDataset(url, ["value"])
    ordered = list(DataLoader(ds, sampler=BatchSampler(SequentialSampler(ds), 32, False),
                              batch_size=None))
    assert torch.equal(torch.cat([b["value"] for b in ordered]),
                       torch.cat([daskrl.open_store(url).load(b)["value"].flatten()
                                  for b in range(4)]))
    fresh = daskrl.TransitionDataset(url, ["value"])
    TrajectoryStore(url, read_only=False).delete_batches([2])
    with pytest.raises(daskrl.BatchNotFoundError, match="2"):
        fresh.get_batch([0, 2 * 32])  # batch 2 was deleted after the dataset was made
    path = daskrl.open_store(url).records()[3]["path"]
    data = (tmp_path / "s" / path).read_bytes()
    (tmp_path / "s" / path).write_bytes(data[:-200] + bytes(200))  # damaged container
    with pytest.raises(daskrl.StoreError):
        fresh.get_batch([3 * 32])


def test_group_shuffle_sampler_reads_each_batch_once_with_a_small_cache(tmp_path):
    url = str(tmp_path / "s")
    _tagged_store(url, 12)
    per_batch = 8 * 4 * 8 * 2  # origin and value, int64 [8, 4]
    ds = daskrl.TransitionDataset(url, ["origin", "value"], cache_bytes=4 * per_batch)
    sampler = GroupShuffleSampler(ds, 10, resident_batches=2, seed=5)
    batches = list(DataLoader(ds, sampler=sampler, batch_size=None))
    assert len(batches) == len(sampler) == -(-len(ds) // 10)
    assert ds.cache.slots == 4 and ds.cache.loads == 12  # each batch read once in the epoch
    values = torch.cat([b["value"] for b in batches])
    assert sorted(values.tolist()) == sorted(ds.get_batch(np.arange(len(ds)))["value"].tolist())
    for b in batches:  # a minibatch holds the items of at most two groups of two batches
        assert len(set(b["origin"].tolist())) <= 4
        _check_real(b["origin"], b["value"])
    assert np.mean([len(set(b["origin"].tolist())) for b in batches]) > 1.5  # they mix
    again = list(GroupShuffleSampler(ds, 10, resident_batches=2, seed=5))
    assert again == [b for b in GroupShuffleSampler(ds, 10, resident_batches=2, seed=5)]
    nxt = GroupShuffleSampler(ds, 10, resident_batches=2, seed=5)
    first, second = list(nxt), list(nxt)
    assert first != second and sorted(i for b in first for i in b) == sorted(i for b in second for i in b)
    assert all(len(b) == 10 for b in GroupShuffleSampler(ds, 10, drop_last=True))
    with pytest.raises(ConfigError, match=re.escape("resident_batches must be an integer >= 1")):
        GroupShuffleSampler(ds, 10, resident_batches=0)
    with pytest.raises(ConfigError, match=re.escape("samples a daskrl.TransitionDataset")):
        GroupShuffleSampler(list(range(5)), 2)


@pytest.mark.timeout(120)
def test_replay_pool_follows_new_batches_and_the_window(tmp_path):
    url = str(tmp_path / "s")
    _tagged_store(url, 2)
    ds = daskrl.ReplayDataset(url, ["origin", "value"], samples_per_batch=16, batch_size=16,
                              resident_batches=2, window=2, seed=0)
    it = iter(ds)
    assert set(next(it)["origin"].tolist()) <= {0, 1}
    w = TrajectoryStore(url, read_only=False)
    t, e = np.meshgrid(np.arange(8), np.arange(4), indexing="ij")
    for b in (2, 3):  # committed while the dataset samples: the window moves to [2, 3]
        w.write_batch(b, {"origin": np.full((8, 4), b, np.int64), "value": 1000 * b + 10 * t + e,
                          "reward": np.zeros((8, 4), np.float32)},
                      {"frames": 32, "weights_version": 0, "worker": "w", "device": "cpu",
                       "episode_returns": [], "episode_lengths": [], "shape": [8, 4]})
    later = [next(it) for _ in range(4)]
    # the next refresh (before the next minibatch) drops 0 and 1, out of the window, and fills
    # the pool with 2 and 3
    for b in later:
        assert set(b["origin"].tolist()) <= {2, 3}
        _check_real(b["origin"], b["value"])
    assert {o for b in later for o in b["origin"].tolist()} >= {2, 3}
