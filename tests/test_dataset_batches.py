"""Batched reads of the torch datasets: whole minibatches equal to item reads, over a store of
several runs and envs written by real collectors (one of them with Dict observations), through
DataLoaders with and without workers; ReplayDataset minibatches through DataLoader workers; the
cache's bounds. The readers on stores written directly, in this process (no cluster, no
DataLoader workers): tests/unit/test_dataset_batches.py.

The store is written on an in-process cluster: the tests that read it in this process only are
in the cluster tier (marked: the tier rule cannot see the fixture's cluster); those with
DataLoader worker processes are system tests."""

from __future__ import annotations

import functools
import logging
import re

import numpy as np
import pytest
import torch
from distributed import Client, LocalCluster
from tagged_stores import check_real as _check_real
from tagged_stores import tagged_store as _tagged_store
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

import daskrl
from daskrl import ConfigError, DatasetIndexError
from daskrl.testing import CountingEnv, TagPolicy

RUN1 = 1_000_000_000
SHORT = functools.partial(CountingEnv, length=3)


@pytest.fixture(scope="module")
def store_url(tmp_path_factory):
    """Run 0: two envs (episodes of 3 and 5 steps), 2 streams, 4 rounds of [T=5, E=2] batches.
    Run 1: GoalCounting (Dict observations, another layout), 2 batches of [T=4, E=2]."""
    url = str(tmp_path_factory.mktemp("batches") / "store")
    with (LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                       dashboard_address=None, silence_logs=logging.ERROR) as cluster,
          Client(cluster, set_as_default=False) as client):
        with daskrl.Collector([SHORT, "daskrl.testing:Counting-v0"], TagPolicy(), url,
                              client=client, envs_per_worker=2, frames_per_batch=10,
                              total_frames=80, num_workers=2) as c:
            list(c)
        with daskrl.Collector("daskrl.testing:GoalCounting-v0", TagPolicy(),
                              url, client=client, envs_per_worker=2, frames_per_batch=8,
                              total_frames=16, num_workers=1) as c:
            list(c)
    return url


def _stacked(items):
    """Item reads stacked as a minibatch is (tuples stay tuples)."""
    first = items[0]
    if isinstance(first, dict):
        return {k: _stacked([it[k] for it in items]) for k in first}
    if isinstance(first, tuple):
        return tuple(_stacked([it[i] for it in items]) for i in range(len(first)))
    return torch.stack(items)


def _assert_same(got, want, where=""):
    assert type(got) is type(want), where
    if isinstance(want, dict):
        assert list(got) == list(want), where
        for k in want:
            _assert_same(got[k], want[k], f"{where}/{k}")
    else:
        assert got.dtype == want.dtype and torch.equal(got, want), where


def _real(store, ep_ids, steps, obs):
    """Every (episode_id, step) is a transition of the store with that observation."""
    table = {}
    for b in store.batch_ids():
        d = store.load(b, keys=["episode_id", "step", "observation"])
        o = d["observation"]["observation"] if isinstance(d["observation"], dict) else d["observation"]
        for i, s, x in zip(d["episode_id"].flatten().tolist(), d["step"].flatten().tolist(),
                           o.reshape(-1, 2).tolist()):
            table[(i, s)] = x
    for i, s, x in zip(ep_ids.tolist(), steps.tolist(), obs.tolist()):
        assert table[(i, s)] == x, (i, s)


@pytest.mark.cluster
@pytest.mark.timeout(120)
@pytest.mark.parametrize("sequence_length", [None, 3])
def test_minibatches_equal_item_reads_over_runs_envs_and_layouts(store_url, sequence_length):
    store = daskrl.open_store(store_url)
    run0 = [b for b in store.batch_ids() if b < RUN1]
    ds = daskrl.TransitionDataset(store_url, sequence_length=sequence_length, batch_ids=run0)
    rng = np.random.default_rng(0)
    for size in (1, 7, 64, len(ds)):
        idx = rng.integers(-len(ds), len(ds), size)  # negative indices and repeats too
        want = _stacked([ds[int(i)] for i in idx])
        _assert_same(ds.get_batch(idx), want)
        _assert_same(ds[idx.tolist()], want)
        _assert_same(ds.get_batch(torch.from_numpy(idx)), want)
        _assert_same(_stacked(ds.__getitems__(idx.tolist())), want)
    # Dict observations (run 1): the same nesting as an item, stacked
    goal = daskrl.TransitionDataset(store_url, sequence_length=sequence_length, env=0,
                                    batch_ids=[b for b in store.batch_ids() if b >= RUN1])
    idx = rng.integers(0, len(goal), 20)
    batch = goal.get_batch(idx)
    assert set(batch["observation"]) == {"observation", "achieved_goal", "desired_goal", "phase"}
    _assert_same(batch, _stacked([goal[int(i)] for i in idx]))


@pytest.mark.cluster
def test_a_batched_epoch_reads_every_transition_once_and_each_batch_once(store_url):
    store = daskrl.open_store(store_url)
    ds = daskrl.TransitionDataset(store_url, ["episode_id", "step"],
                                  env=[0, 1])  # run 1's GoalCounting is env 0 too
    assert ds.batch_ids == store.batch_ids()
    loader = DataLoader(ds, sampler=BatchSampler(RandomSampler(ds), 16, drop_last=False),
                        batch_size=None)
    seen = []
    for batch in loader:
        seen += list(zip(batch["episode_id"].tolist(), batch["step"].tolist()))
        assert len(batch["step"]) <= 16
    assert len(seen) == len(ds) == store.frames and len(set(seen)) == len(seen)
    want = {(int(i), int(s)) for b in store.batch_ids() for i, s in
            zip(store.load(b)["episode_id"].flatten(), store.load(b)["step"].flatten())}
    assert set(seen) == want
    assert ds.cache.loads == len(store.batch_ids())  # each batch read once in the epoch
    # every array: run 1's observations are a Dict's, which cannot stack with run 0's
    everything = daskrl.TransitionDataset(store_url)
    with pytest.raises(ConfigError, match="a minibatch mixes batches with different arrays"):
        everything.get_batch([0, len(everything) - 1])


@pytest.mark.cluster
def test_env_selection_and_mixed_layouts(store_url):
    store = daskrl.open_store(store_url)
    by_label = daskrl.TransitionDataset(store_url, ["observation", "step", "terminated"],
                                        env="daskrl.testing:Counting-v0")
    assert by_label.batch_ids == [h.batch_id for h in store.handles(env="daskrl.testing:Counting-v0")]
    batch = by_label.get_batch(np.arange(len(by_label)))
    # Counting-v0's episodes last 5 steps: the step ending one is 4, and only that
    assert torch.equal(batch["terminated"], batch["step"] == 4)
    assert torch.equal(batch["observation"][:, 1], batch["step"].float())
    short = daskrl.TransitionDataset(store_url, ["step", "terminated"], env=0,
                                     batch_ids=[b for b in store.batch_ids() if b < RUN1])
    b = short.get_batch(np.arange(len(short)))
    assert torch.equal(b["terminated"], b["step"] == 2)
    with pytest.raises(daskrl.UsageError, match="env= selects by env index"):
        daskrl.TransitionDataset(store_url, env=-1)
    mixed = daskrl.TransitionDataset(store_url, ["observation"], env=0)
    with pytest.raises(ConfigError, match=re.escape("mixes batches with different arrays")):
        mixed.get_batch([0, len(mixed) - 1])  # [2] floats and a Dict
    assert mixed[0]["observation"].shape == (2,)  # item reads of either still work
    assert set(mixed[len(mixed) - 1]["observation"]) >= {"observation", "phase"}
    assert mixed.get_batch([len(mixed) - 1, len(mixed) - 2])["observation"]["phase"].shape == (2,)


@pytest.mark.timeout(180)
def test_two_loader_workers_batched_and_collated(store_url):
    store = daskrl.open_store(store_url)
    run0 = [b for b in store.batch_ids() if b < RUN1]
    ds = daskrl.TransitionDataset(store_url, ["episode_id", "step", "observation"], batch_ids=run0)
    for loader in (
        DataLoader(ds, sampler=BatchSampler(RandomSampler(ds), 8, drop_last=False),
                   batch_size=None, num_workers=2),
        DataLoader(ds, batch_size=8, shuffle=True, num_workers=2),  # __getitems__ + collate
    ):
        batches = list(loader)
        ids = torch.cat([b["episode_id"] for b in batches])
        steps = torch.cat([b["step"] for b in batches])
        obs = torch.cat([b["observation"] for b in batches])
        assert len(set(zip(ids.tolist(), steps.tolist()))) == len(ds) == len(ids)
        _real(store, ids, steps, obs)
    assert ds._cache is None  # the workers had their own caches; this process read nothing


@pytest.mark.cluster
def test_the_cache_is_bounded_and_reads_in_waves(store_url):
    store = daskrl.open_store(store_url)
    run0 = [b for b in store.batch_ids() if b < RUN1]
    one = store.load(run0[0], keys=["step", "observation"])
    per_batch = sum(v.numel() * v.element_size() for v in one.values())
    ds = daskrl.TransitionDataset(store_url, ["step", "observation"], batch_ids=run0,
                                  cache_bytes=3 * per_batch)
    everything = np.random.default_rng(2).permutation(len(ds))
    got = ds.get_batch(everything)  # needs 8 batches; the cache holds 3
    assert ds.cache.slots == 3 and len(ds.cache) <= 3 and ds.cache.nbytes <= 3 * per_batch
    assert ds.cache.loads == len(run0)  # each once, in waves
    _assert_same(got, _stacked([ds[int(i)] for i in everything]))
    few = daskrl.TransitionDataset(store_url, ["step"], batch_ids=run0, cache_batches=2)
    few.get_batch(everything)
    assert few.cache.slots == 2 and len(few.cache) == 2
    for bad, what in ((0, "cache_bytes must be an integer >= 1, got 0."),
                      (True, "cache_bytes must be an integer >= 1, got True.")):
        with pytest.raises(ConfigError, match=re.escape(what)):
            daskrl.TransitionDataset(store_url, cache_bytes=bad)


@pytest.mark.cluster
def test_bad_minibatch_indices(store_url):
    ds = daskrl.TransitionDataset(store_url, ["step"], env=1)
    n = len(ds)
    with pytest.raises(DatasetIndexError, match=re.escape(f"index {n} out of range for a "
                                                          f"dataset of {n} items.")):
        ds.get_batch([0, n])
    with pytest.raises(DatasetIndexError, match=re.escape(f"index {-n - 1} out of range")):
        ds[[-n - 1]]
    with pytest.raises(DatasetIndexError, match="integer indices, got an array of shape \\[2\\] "
                                                "and dtype float64"):
        ds.get_batch([0.0, 1.5])
    with pytest.raises(DatasetIndexError, match="at least one index"):
        ds.get_batch([])


@pytest.mark.timeout(120)
def test_replay_stacked_minibatches_with_two_loader_workers(tmp_path):
    url = str(tmp_path / "s")
    _tagged_store(url, 6)
    ds = daskrl.ReplayDataset(url, ["origin", "value"], samples_per_batch=32, num_samples=200,
                              batch_size=32, resident_batches=4, window=5)
    batches = list(DataLoader(ds, batch_size=None, num_workers=2, timeout=120))
    assert sum(len(b["value"]) for b in batches) == 200
    for b in batches:
        assert b["value"].shape[0] <= 32 and b["origin"].shape == b["value"].shape
        _check_real(b["origin"], b["value"])
        assert set(b["origin"].tolist()) <= {1, 2, 3, 4, 5}  # window=5: the newest 5
    assert max(len(set(b["origin"].tolist())) for b in batches) >= 3
    seqs = list(daskrl.ReplayDataset(url, ["value"], sequence_length=3, samples_per_batch=16,
                                     num_samples=48, batch_size=16))
    for s in seqs:  # windows of 3 consecutive steps of one env of one batch
        assert s["value"].shape == (16, 3)
        assert torch.all(torch.diff(s["value"], dim=1) == 10)
    with pytest.raises(ConfigError, match=re.escape("resident_batches must be an integer >= 1")):
        daskrl.ReplayDataset(url, resident_batches=0)
