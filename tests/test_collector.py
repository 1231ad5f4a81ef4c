"""End to end on a real spawn-based LocalCluster: weights -> workers -> rollouts -> store -> handles.
(Bad input, refused before any cluster starts: tests/unit/test_collector.py.)"""

from __future__ import annotations

import functools
import uuid

import numpy as np
import pytest
import torch
from child_processes import children as _children
from distributed import Client

import daskrl
from daskrl.testing import ConstantPolicy, EnvVarEnv, TagPolicy

COUNTING = "daskrl.testing:Counting-v0"


def _weight_loads(client: Client, collector: daskrl.Collector) -> dict[str, int]:
    return client.run(lambda dask_worker: sum(
        p.weight_loads for n, p in dask_worker.plugins.items() if n.startswith("daskrl-")))


def test_total_frames_is_exact_and_the_last_batch_shorter(client, tmp_path):
    with daskrl.Collector("CartPole-v1", ConstantPolicy(0, torch.int64), str(tmp_path / "s"),
                          client=client, envs_per_worker=4, frames_per_batch=64,
                          total_frames=64 * 3 + 16) as collector:
        handles = list(collector)
        assert [h.frames for h in handles] == [64, 64, 64, 16]
        assert [h.batch_id for h in handles] == [0, 1, 2, 3]
        assert handles[-1].load()["observation"].shape == (4, 4, 4)
        workers = set(client.scheduler_info()["workers"])
        assert {h.worker for h in handles} == workers  # both streams used
        assert {h.device for h in handles} == {"cpu"}
        # The module went once per worker, the weights once per version per worker.
        assert sorted(_weight_loads(client, collector).values()) == [1, 1]
    store = daskrl.open_store(str(tmp_path / "s"))
    assert len(store) == 4 and store.frames == 208


def test_batches_record_the_weights_version_that_computed_them(client, tmp_path):
    policy = TagPolicy()
    with daskrl.Collector(COUNTING, policy, str(tmp_path / "s"), client=client,
                          envs_per_worker=2, frames_per_batch=20, total_frames=200) as collector:
        assert collector.weights_version == 0
        for i, handle in enumerate(collector):
            tags = handle.load(keys=["tag"])["tag"]
            assert (tags == handle.weights_version).all(), (handle, tags)
            # rounds: both batches of a round use the version current when the round started
            assert handle.weights_version == i // 2, handle
            assert handle.policy_lag == collector.weights_version - handle.weights_version
            if i % 2 == 1:
                with torch.no_grad():
                    policy.tag.fill_(collector.weights_version + 1)
                assert collector.update_weights(policy) == handle.weights_version + 1
                with torch.no_grad():
                    policy.tag.fill_(-99.0)  # mutated in place right after: not shipped
        assert collector.weights_version == 5
        assert sorted(_weight_loads(client, collector).values()) == [5, 5]  # versions 0..4


def test_submit_returns_a_future_of_a_handle(client, tmp_path):
    with daskrl.Collector(COUNTING, TagPolicy(), str(tmp_path / "s"), client=client,
                          envs_per_worker=2, frames_per_batch=10, total_frames=20) as collector:
        futures = [collector.submit(), collector.submit()]
        handles = client.gather(futures)
        assert [h.batch_id for h in handles] == [0, 1]
        assert all(isinstance(h, daskrl.BatchHandle) for h in handles)
        with pytest.raises(daskrl.CollectorClosedError, match="all submitted"):
            collector.submit()


def test_env_factory_env_vars_and_env_kwargs(client, tmp_path):
    factory = functools.partial(EnvVarEnv, "DASKRL_TEST_OFFSET", 3)
    with daskrl.Collector(factory, TagPolicy(), str(tmp_path / "a"), client=client,
                          envs_per_worker=2, frames_per_batch=12, total_frames=24,
                          env_vars={"DASKRL_TEST_OFFSET": 1000}) as collector:
        obs = [h.load()["observation"] for h in collector]
    assert all((o[..., 0] >= 1000).all() for o in obs)
    with daskrl.Collector(COUNTING, TagPolicy(), str(tmp_path / "b"), client=client,
                          envs_per_worker=2, frames_per_batch=12, total_frames=24,
                          env_kwargs={"length": 3}) as collector:
        lengths = {n for h in collector for n in h.episode_lengths}
    assert lengths == {3}


def test_same_seed_same_layout_same_data(client, tmp_path, cartpole_policy):
    stores = []
    for name in ("a", "b"):
        with daskrl.Collector("CartPole-v1", cartpole_policy, str(tmp_path / name), client=client,
                              envs_per_worker=4, frames_per_batch=200, total_frames=800,
                              seed=5) as collector:
            list(collector)
        stores.append(daskrl.open_store(str(tmp_path / name)))
    a, b = stores
    assert a.batch_ids() == b.batch_ids()
    for bid in a.batch_ids():
        da, db = a.load(bid), b.load(bid)
        for k in da:
            assert torch.equal(da[k], db[k]), (bid, k)


def test_init_random_frames_and_reset_at_each_iter(client, tmp_path):
    with daskrl.Collector("CartPole-v1", ConstantPolicy(1, torch.int64), str(tmp_path / "s"),
                          client=client, envs_per_worker=4, frames_per_batch=80,
                          total_frames=320, init_random_frames=120,
                          reset_at_each_iter=True) as collector:
        actions = [h.load()["action"] for h in collector]
        steps = [h.load()["step"] for h in daskrl.open_store(str(tmp_path / "s"))]
    flat = torch.cat([a.reshape(-1) for a in actions])
    assert set(flat[:120].tolist()) == {0, 1} and (flat[120:] == 1).all()
    assert all((s[0] == 0).all() for s in steps)


def test_async_mode_yields_every_batch_once(client, tmp_path):
    with daskrl.Collector(COUNTING, TagPolicy(), str(tmp_path / "s"), client=client, rounds=False,
                          envs_per_worker=2, frames_per_batch=10, total_frames=100) as collector:
        ids = sorted(h.batch_id for h in collector)
    assert ids == list(range(10))
    assert daskrl.open_store(str(tmp_path / "s")).frames == 100


def test_memory_store_with_in_process_workers(inproc_client):
    url = f"memory://daskrl-{uuid.uuid4().hex}"
    with daskrl.Collector(COUNTING, TagPolicy(), url, client=inproc_client, envs_per_worker=2,
                          frames_per_batch=10, total_frames=40) as collector:
        handles = list(collector)
        assert handles[0].store_url == url
        assert handles[0].load()["observation"].shape == (5, 2, 2)
    assert len(daskrl.open_store(url)) == 4


def test_client_connected_by_address(cluster, tmp_path):
    with Client(cluster.scheduler_address, set_as_default=False) as client:
        with daskrl.Collector(COUNTING, TagPolicy(), str(tmp_path / "s"), client=client,
                              envs_per_worker=2, frames_per_batch=10, total_frames=20) as c:
            assert len(list(c)) == 2
        assert client.status == "running"  # a user's client stays up


def test_embedded_cluster_starts_and_closes(tmp_path):
    before = _children()  # the session's shared cluster may be running
    with daskrl.Collector(COUNTING, TagPolicy(), str(tmp_path / "s"), envs_per_worker=2,
                          frames_per_batch=10, total_frames=40, num_workers=2) as collector:
        assert len(collector.client.scheduler_info()["workers"]) == 2
        assert len(list(collector)) == 4
        cluster = collector.client.cluster
    assert collector.client.status == "closed" and cluster.status.name == "closed"
    assert _children() <= before


def test_stored_transitions_are_real_on_cartpole(client, tmp_path, cartpole_policy):
    with daskrl.Collector("CartPole-v1", cartpole_policy, str(tmp_path / "s"), client=client,
                          envs_per_worker=4, frames_per_batch=400, total_frames=1600) as c:
        data = [h.load() for h in c]
    obs = torch.cat([d["observation"] for d in data])
    nxt = torch.cat([d["next_observation"] for d in data])
    done = torch.cat([d["terminated"] | d["truncated"] for d in data])
    # Batches of one stream follow each other: rows alternate between the two streams.
    per_stream = [torch.cat([d[k] for d in data[s::2]]) for s in (0, 1)
                  for k in ("observation", "next_observation")]
    for o, n in (per_stream[0:2], per_stream[2:4]):
        d = torch.cat([x["terminated"] | x["truncated"] for x in data[0::2]]) if o is per_stream[0] \
            else torch.cat([x["terminated"] | x["truncated"] for x in data[1::2]])
        cont = ~d[:-1]
        assert torch.equal(n[:-1][cont], o[1:][cont])  # successor within an episode
    # At an end, the true final observation is stored, not the reset one; steps restart.
    assert done.any()
    assert not torch.equal(nxt[done], obs[done])
    assert (np.abs(nxt[done].numpy()[:, [0, 2]]) > [2.4, 0.2094]).any(axis=1).sum() > 0
    # Steps restart after an end, within each stream (batches of the two streams alternate, so
    # across a batch boundary the next row may belong to the other stream's envs).
    for s in (0, 1):
        step_s = torch.cat([d["step"] for d in data[s::2]])
        done_s = torch.cat([d["terminated"] | d["truncated"] for d in data[s::2]])
        assert (step_s[1:][done_s[:-1]] == 0).all()
