"""Batched reads of the torch datasets: whole minibatches equal to item reads, over a store of
several runs and envs written by real collectors (one of them with Dict observations), through
DataLoaders with and without workers; ReplayDataset minibatches mixing batches; the cache's
bounds; and reads that stay on the store's checked path."""

from __future__ import annotations

import functools
import logging
import re

import numpy as np
import pytest
import torch
from distributed import Client, LocalCluster
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

import daskrl
from daskrl import ConfigError, DatasetIndexError
from daskrl.store import GroupShuffleSampler, TrajectoryStore
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


def _tagged_store(url: str, n: int, T: int = 8, E: int = 4) -> None:
    """``n`` batches; each transition's ``value`` is ``1000 * batch + 10 * t + e``."""
    w = TrajectoryStore(url, read_only=False)
    w.initialize()
    t, e = np.meshgrid(np.arange(T), np.arange(E), indexing="ij")
    for b in range(n):
        arrays = {"origin": np.full((T, E), b, np.int64), "value": (1000 * b + 10 * t + e),
                  "reward": np.zeros((T, E), np.float32)}
        w.write_batch(b, arrays, {"frames": T * E, "weights_version": 0, "worker": "w",
                                  "device": "cpu", "episode_returns": [], "episode_lengths": [],
                                  "shape": [T, E]})


def _check_real(origin: torch.Tensor, value: torch.Tensor, T: int = 8, E: int = 4) -> None:
    rest = value - 1000 * origin
    assert torch.all((rest // 10 < T) & (rest % 10 < E) & (rest >= 0))


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
