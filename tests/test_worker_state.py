"""A collector's state on real in-process Dask workers (``distributed.utils_test.gen_cluster``):
weights versions loaded once each and from where, stream envs kept across batches and dropped
when their batch is lost, teardown leaving nothing, and worker errors naming the env or the
weights. No collector: the tests drive the plugin and its tasks as the learner would. (Errors
through Dask's error transport, without a cluster: tests/unit/test_worker_state.py.)"""

from __future__ import annotations

import functools
import glob
import itertools
import os
import re

import pytest
import zarr
from conftest import gen_cluster

import daskrl
from daskrl.config import CollectorConfig
from daskrl.errors import CollectorClosedError, EnvError, StreamError, WeightsUnavailableError
from daskrl.testing import CountingEnv, TagPolicy, check_episode_continuity
from daskrl.weights import policy_spec, snapshot, weights_layout
from daskrl.weights._cache import weights_name
from daskrl.weights._segments import SegmentPool, shared_memory_dir
from daskrl.worker._envs import EnvSpec
from daskrl.worker._plugin import CollectorPlugin
from daskrl.worker._stream import StreamSpec, run_stream
from daskrl.worker._tasks import BatchTask, collect_batch

E, T = 2, 6
_names = itertools.count()

OPEN_ENVS: set[int] = set()
"""ids of the :class:`TrackedEnv` s not closed yet (in-process workers share this module)."""


class TrackedEnv(CountingEnv):
    def __init__(self, length: int = 4) -> None:
        super().__init__(length)
        OPEN_ENVS.add(id(self))

    def close(self) -> None:
        OPEN_ENVS.discard(id(self))
        super().close()


@pytest.fixture
def store(tmp_path) -> str:
    """A new store, created as the learner creates it. (Out here, before gen_cluster's check
    for leaked threads begins: zarr's I/O threads start with its first use in the process.)"""
    url = str(tmp_path / "store")
    daskrl.TrajectoryStore(url, read_only=False).initialize()
    zarr.open_group(str(tmp_path / "zarr-warm-up"), mode="w").attrs.put({"a": 1})
    return url


def _plugin(store: str, env: EnvSpec | None = None) -> CollectorPlugin:
    name = f"daskrl-test-{os.getpid()}-{next(_names)}"
    cfg = CollectorConfig(envs_per_worker=E, frames_per_batch=E * T)
    return CollectorPlugin(name, env or EnvSpec(TrackedEnv), policy_spec(TagPolicy(), None),
                           cfg, "cpu", {}, store, {})


def _task(batch_id: int, version: int, weights, previous: int | None = None,
          stream: int = 0) -> BatchTask:
    return BatchTask(batch_id=batch_id, stream=stream, previous_batch_id=previous, steps=T,
                     random_steps=0, weights_version=version, weights=weights)


def _with_tag(value: float) -> TagPolicy:
    policy = TagPolicy()
    policy.tag.data.fill_(value)
    return policy


def _host_copies(plugin_name: str) -> list[str]:
    return glob.glob(os.path.join(shared_memory_dir(), f"daskrl-host-{plugin_name}-*"))


@pytest.mark.timeout(120)
@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)], timeout=100)
async def test_shared_memory_versions_load_once_each_and_reach_the_data(c, s, a, store):
    plugin = _plugin(store)
    await c.register_plugin(plugin, name=plugin.name)
    pool = SegmentPool()
    try:
        layout = weights_layout(TagPolicy())
        manifests = [pool.write(_with_tag(v), v, layout)[1] for v in (0, 1)]
        handles = []
        for batch_id, version in enumerate((0, 0, 1)):
            previous = batch_id - 1 if batch_id else None
            fut = c.submit(collect_batch, plugin.name, _task(batch_id, version, manifests[version],
                                                             previous), pure=False)
            handles.append(await fut)
        state = a.plugins[plugin.name]
        assert state.version == 1 and state.weight_loads == 2
        assert state.weight_sources == [(0, "shared-memory"), (1, "shared-memory")]
        for handle, version in zip(handles, (0, 0, 1)):
            assert handle.weights_version == version
            assert (handle.load(keys=["tag"])["tag"] == version).all()  # what the policy held
        check_episode_continuity(daskrl.open_store(store))
    finally:
        pool.close()
        await c.unregister_worker_plugin(plugin.name)


@pytest.mark.timeout(120)
@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 3, timeout=100)
async def test_dask_sent_weights_come_from_the_seed_then_one_fetch_per_host(c, s, a, b, w3,
                                                                           store):
    plugin = _plugin(store)
    await c.register_plugin(plugin, name=plugin.name)
    try:
        [seeded] = await c.scatter([snapshot(_with_tag(3.0), 0)], workers=[a.address])
        await c.publish_dataset(seeded, name=weights_name(plugin.name, 0))
        for batch_id, worker in enumerate((a, b, w3)):
            handle = await c.submit(collect_batch, plugin.name, _task(batch_id, 0, seeded.key,
                                                                       stream=batch_id),
                                    workers=[worker.address], pure=False)
            assert (handle.load(keys=["tag"])["tag"] == 3.0).all()
        sources = [w.plugins[plugin.name].weight_sources for w in (a, b, w3)]
        # a holds the scattered copy; b fetches it and leaves this host's copy, w3 reads that.
        assert sources == [[(0, "seed")], [(0, "dask")], [(0, "host-copy")]]
        assert _host_copies(plugin.name)
    finally:
        await c.unpublish_dataset(weights_name(plugin.name, 0))
        await c.unregister_worker_plugin(plugin.name)
    # Teardown: the host copy is removed, every env is closed, the plugin is gone.
    assert not _host_copies(plugin.name)
    assert not OPEN_ENVS
    assert all(plugin.name not in w.plugins for w in (a, b, w3))


@pytest.mark.timeout(120)
@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)], timeout=100)
async def test_stream_envs_continue_and_are_dropped_when_their_write_loses(c, s, a, store):
    plugin = _plugin(store)
    await c.register_plugin(plugin, name=plugin.name)
    pool = SegmentPool()
    try:
        [manifest] = [pool.write(TagPolicy(), 0, weights_layout(TagPolicy()))[1]]
        state = a.plugins[plugin.name]
        first = await c.submit(collect_batch, plugin.name, _task(0, 0, manifest), pure=False)
        assert state.streams() == {0: 0}
        second = await c.submit(collect_batch, plugin.name, _task(1, 0, manifest, 0), pure=False)
        assert state.streams() == {0: 1}  # the same envs, one batch on
        obs = second.load(keys=["observation"])["observation"]
        last = first.load(keys=["next_observation"])["next_observation"][-1]
        assert (obs[0] == last).all()  # episodes continue across the batches
        assert len(OPEN_ENVS) == E
        # Another attempt of batch 1 (a re-run after a lost worker): its write loses to the
        # committed one, which it hands back; the stream's envs are closed and forgotten.
        again = await c.submit(collect_batch, plugin.name, _task(1, 0, manifest, 0), pure=False)
        assert again.path == second.path
        assert state.streams() == {}
        assert not OPEN_ENVS
    finally:
        pool.close()
        await c.unregister_worker_plugin(plugin.name)


@pytest.mark.timeout(120)
@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)], timeout=100)
async def test_an_endless_episode_is_named_and_its_envs_dropped(c, s, a, store):
    env = EnvSpec(functools.partial(CountingEnv, 10**9), endless_episode_steps=2 * T)
    plugin = _plugin(store, env)
    await c.register_plugin(plugin, name=plugin.name)
    pool = SegmentPool()
    try:
        manifest = pool.write(TagPolicy(), 0, weights_layout(TagPolicy()))[1]
        await c.submit(collect_batch, plugin.name, _task(0, 0, manifest), pure=False)
        with pytest.raises(EnvError, match=r"has run an episode of 12 steps without terminating"
                                           r"(.|\n)*\[worker .*, weights version 0\]"):
            await c.submit(collect_batch, plugin.name, _task(1, 0, manifest, 0), pure=False)
        assert a.plugins[plugin.name].streams() == {}
    finally:
        pool.close()
        await c.unregister_worker_plugin(plugin.name)


@pytest.mark.timeout(120)
@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)], timeout=100)
async def test_weights_no_longer_published_and_a_missing_plugin_are_named(c, s, a, store):
    plugin = _plugin(store)
    await c.register_plugin(plugin, name=plugin.name)
    try:
        with pytest.raises(WeightsUnavailableError, match=r"weights version 4 .* is no longer "
                                                          r"published"):
            await c.submit(collect_batch, plugin.name, _task(0, 4, "gone-key"), pure=False)
        assert a.plugins[plugin.name].version is None  # nothing (half) loaded counts
    finally:
        await c.unregister_worker_plugin(plugin.name)
    with pytest.raises(CollectorClosedError, match="has no daskrl plugin"):
        await c.submit(collect_batch, plugin.name, _task(0, 0, "k"), pure=False)


@pytest.mark.timeout(60)
@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)], timeout=50)
async def test_a_stream_that_cannot_reach_its_learner_says_where_it_tried(c, s, a, store):
    import socket

    plugin = _plugin(store)
    await c.register_plugin(plugin, name=plugin.name)
    with socket.socket() as sock:  # a port of this host that nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    learner = f"tcp://127.0.0.1:{port}"
    spec = StreamSpec(stream=0, epoch=0, learner=learner, token="t", connect_timeout=1.0)
    with pytest.raises(StreamError, match=re.escape(
            f"worker {a.address} cannot reach the learner at {learner}: ")) as e:
        await c.submit(run_stream, plugin.name, spec, pure=False)
    assert "daskrl.learner.host" in str(e.value)  # what to set where workers see it elsewhere
