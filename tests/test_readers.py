"""Readers for learners on a store written by real collectors: selections, device loads,
episodes across batches, the dask view, and torch datasets with parallel DataLoader workers.

The store is written on an in-process cluster: the tests that read it in this process only are
in the cluster tier (marked: the tier rule cannot see the fixture's cluster); those with
DataLoader worker processes are system tests."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest
import torch
from distributed import Client, LocalCluster
from torch.utils.data import DataLoader

import daskrl
import daskrl.data
from daskrl.testing import TagPolicy

EPISODE = 5  # CountingEnv: episodes of 5 steps, observation [episode, t], reward t + 1


@pytest.fixture(scope="module")
def store_url(tmp_path_factory):
    """Run 0: 2 streams x 4 rounds of [T=4, E=2] batches (episodes span batches), weights
    versions 0..3.  Run 1: reset_at_each_iter, [T=3, E=2] batches (episodes cut each batch)."""
    url = str(tmp_path_factory.mktemp("readers") / "store")
    with (LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                       dashboard_address=None, silence_logs=logging.ERROR) as cluster,
          Client(cluster, set_as_default=False) as client):
        policy = TagPolicy()
        with daskrl.Collector("daskrl.testing:Counting-v0", policy, url, client=client,
                              envs_per_worker=2, frames_per_batch=8, total_frames=64,
                              num_workers=2) as c:
            for i, _ in enumerate(c):
                if i % 2 == 1:
                    with torch.no_grad():
                        policy.tag += 1
                    c.update_weights(policy)
        with daskrl.Collector("daskrl.testing:Counting-v0", TagPolicy(), url, client=client,
                              envs_per_worker=2, frames_per_batch=6, total_frames=12,
                              num_workers=1, reset_at_each_iter=True) as c:
            list(c)
    return url


RUN1 = 1_000_000_000


@pytest.mark.cluster
def test_counts_and_selections(store_url):
    store = daskrl.open_store(store_url)
    assert store.num_batches == len(store) == 10 and store.frames == 64 + 12
    assert store.weights_versions() == [0, 1, 2, 3]
    assert sorted(store.runs()) == [0, 1] and store.runs()[1]["settings"]["reset_at_each_iter"]
    v1 = store.handles(weights_version=1)
    assert [h.batch_id for h in v1] == [2, 3]
    assert [h.batch_id for h in store.handles(weights_version=range(2, 4))] == [4, 5, 6, 7]
    late = [h.batch_id for h in store.handles(weights_version=lambda v: v >= 3)]
    assert late == [6, 7]
    workers = store.workers()
    assert 1 <= len(workers) <= 2
    assert {h.worker for h in store.handles(worker=workers[0])} == {workers[0]}
    seen = []
    for h, batch in store.iter_batches(["tag"], weights_version=[0, 3]):
        assert set(batch) == {"tag"} and torch.all(batch["tag"] == h.weights_version)
        seen.append(h.batch_id)
    assert seen[:4] == [0, 1, 6, 7]


@pytest.mark.cluster
def test_load_onto_a_device_one_tensor_per_array(store_url):
    store = daskrl.open_store(store_url)
    batch = store.load(0, device="cpu")
    for name, t in batch.items():
        assert t.is_contiguous() and t.shape[:2] == (4, 2), name
        # each array is its own tensor (decoded in place, no shared scratch buffer)
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size(), name
    assert len({t.data_ptr() for t in batch.values()}) == len(batch)
    meta = store.load(0, device="meta", keys=["observation"])
    assert meta["observation"].device.type == "meta" and meta["observation"].shape == (4, 2, 2)


@pytest.mark.cluster
def test_episodes_are_reassembled_across_batches(store_url):
    store = daskrl.open_store(store_url)
    eps = list(daskrl.data.episodes(store, ["observation", "reward", "step"]))
    ended = sum(len(r["episode_returns"]) for r in store.records().values())
    assert len(eps) == ended  # run 1 (T=3 < 5, reset each batch) ends none: all cut
    assert len({e.episode_id for e in eps}) == len(eps)
    for ep in eps:
        assert ep.complete and ep.length == EPISODE and ep.total_reward == 15.0
        assert torch.equal(ep.data["step"], torch.arange(EPISODE))
        assert torch.equal(ep.data["observation"][:, 1], torch.arange(EPISODE, dtype=torch.float32))
        assert bool(ep.data["terminated"][-1]) and not ep.data["terminated"][:-1].any()
        assert len(ep.batch_ids) == 2 and ep.batch_ids[0] < ep.batch_ids[1] < RUN1  # T=4 < 5
        assert ep.episode_id // 2**24 <= ep.batch_ids[0]
    everything = list(daskrl.data.episodes(store, ["reward"], complete_only=False))
    cut = [e for e in everything if not e.complete]
    run1_cut = [e for e in cut if e.batch_ids[0] >= RUN1]
    assert len(run1_cut) == 2 * 2 and all(e.length == 3 and len(e.batch_ids) == 1 for e in run1_cut)
    assert all(e.length < EPISODE for e in cut)
    assert sum(e.length for e in everything) == store.frames  # every row in exactly one episode


@pytest.mark.cluster
def test_dask_view(store_url):
    store = daskrl.open_store(store_url)
    loads = {b: store.load(b) for b in store.batch_ids()}
    frames = daskrl.data.to_dask(store, ["reward", "observation"])
    assert frames["observation"].shape == (76, 2)
    want = np.concatenate([loads[b]["observation"].numpy().reshape(-1, 2) for b in loads])
    np.testing.assert_array_equal(frames["observation"].compute(), want)
    time = daskrl.data.to_dask(store, ["reward"], layout="time")["reward"]
    assert time.shape == (4 * 8 + 3 * 2, 2)
    run0 = store.batch_ids()[:8]
    env = daskrl.data.to_dask(store, ["step"], layout="env", batch_ids=run0)["step"]
    assert env.shape == (4, 16)
    np.testing.assert_array_equal(env.compute(), np.concatenate(
        [loads[b]["step"].numpy() for b in run0], axis=1))
    with pytest.raises(daskrl.StoreError, match=re.escape("cannot concatenate 'step' along 'env'")):
        daskrl.data.to_dask(store, ["step"], layout="env")
    with pytest.raises(daskrl.ConfigError, match=re.escape("layout must be one of")):
        daskrl.data.to_dask(store, layout="batch")


def test_transition_dataset_epoch_with_two_loader_workers(store_url):
    ds = daskrl.TransitionDataset(store_url, ["episode_id", "step", "observation"])
    assert len(ds) == 76
    seen = []
    loader = DataLoader(ds, batch_size=16, shuffle=True, num_workers=2, timeout=120)
    for batch in loader:
        assert batch["observation"].shape[1:] == (2,)
        seen += list(zip(batch["episode_id"].tolist(), batch["step"].tolist()))
    assert len(seen) == 76 and len(set(seen)) == 76  # every transition exactly once
    store = daskrl.open_store(store_url)
    want = {(int(i), int(s)) for b in store.batch_ids()
            for i, s in zip(store.load(b)["episode_id"].flatten(), store.load(b)["step"].flatten())}
    assert set(seen) == want
    seq = daskrl.TransitionDataset(store_url, ["step", "episode_id"], sequence_length=3)
    assert len(seq) == 8 * (4 - 2) * 2 + 2 * (3 - 2) * 2
    bid, t, e = seq.locate(-1)
    assert (bid, t, e) == (RUN1 + 1, 0, 1)
    item = seq[5]
    assert item["step"].shape == (3,)
    with pytest.raises(IndexError, match=re.escape("index 36 out of range for a dataset of 36 items.")):
        seq[36]


def test_replay_dataset_samples_valid_transitions_in_parallel(store_url):
    newest = daskrl.open_store(store_url).batch_ids()[-2:]
    ds = daskrl.ReplayDataset(store_url, ["observation", "next_observation", "episode_id"],
                              samples_per_batch=8, num_samples=40, window=2, seed=1)
    loader = DataLoader(ds, batch_size=8, num_workers=2)
    batches = list(loader)
    assert sum(len(b["episode_id"]) for b in batches) == 40
    obs = torch.cat([b["observation"] for b in batches])
    nxt = torch.cat([b["next_observation"] for b in batches])
    assert torch.equal(nxt - obs, torch.tensor([0.0, 1.0]).expand_as(obs))
    started = {int(i) // 2**24 for b in batches for i in b["episode_id"]}
    assert started <= set(newest)  # window=2: only the two newest batches
    seqs = daskrl.ReplayDataset(store_url, ["step"], sequence_length=4, samples_per_batch=4,
                                num_samples=8)
    got = list(seqs)  # run 1's batches (T=3) are too short for L=4 and are never drawn
    assert len(got) == 8 and all(g["step"].shape == (4,) for g in got)
    with pytest.raises(daskrl.ConfigError, match=re.escape("samples_per_batch must be an integer >= 1, got 0.")):
        daskrl.ReplayDataset(store_url, samples_per_batch=0)
