"""The weights fan-out tree on real in-process Dask workers, each on a host of its own (loopback
addresses 127.0.0.1-5, each with its own directory for host copies): a host fetches a version
from its parent in the tree, a parent that lacks it gets it first from its own, and a parent
that is gone leaves the child to fetch from the seed. (The tree's shape and its turns: in
tests/unit/test_weights_tree.py; across namespace hosts: tests/test_hosts.py.)"""

from __future__ import annotations

import asyncio
import os

import pytest
import test_worker_state
from conftest import gen_cluster
from test_worker_state import _plugin, _task, _with_tag

from daskrl.weights import snapshot
from daskrl.weights._cache import weights_name
from daskrl.weights._tree import tree_hosts, tree_name
from daskrl.worker._tasks import collect_batch

HOSTS = [(f"127.0.0.{i}", 1) for i in range(1, 6)]

store = test_worker_state.store  # the fixture: a new store, made as the learner makes it


async def _setup(c, workers, store, tmp_path):
    """The plugin on every worker, each host with its own host-copy directory; version 0 sent
    to the first worker and published with its tree."""
    plugin = _plugin(store)
    await c.register_plugin(plugin, name=plugin.name)
    dirs = {}
    for w in workers:
        d = tmp_path / f"shm-{w.address.split('//')[1].split(':')[0]}"
        d.mkdir()
        w.plugins[plugin.name].weights.host_copies.directory = str(d)
        dirs[w.address] = d
    [seeded] = await c.scatter([snapshot(_with_tag(5.0), 0)], workers=[workers[0].address])
    return plugin, seeded, dirs


async def _batch(c, plugin, worker, batch_id, key):
    handle = await c.submit(collect_batch, plugin.name, _task(batch_id, 0, key, stream=batch_id),
                            workers=[worker.address], pure=False)
    assert (handle.load(keys=["tag"])["tag"] == 5.0).all()  # the version's values ran


def _copies(d) -> list[str]:
    return [n for n in os.listdir(d) if n.endswith(".json")]


@pytest.mark.timeout(120)
@gen_cluster(client=True, nthreads=HOSTS, timeout=100)
async def test_a_host_fetches_from_its_parent_which_fetches_from_its_own(c, s, *workers,
                                                                        store, tmp_path):
    plugin, seeded, dirs = await _setup(c, workers, store, tmp_path)
    name = weights_name(plugin.name, 0)
    tree = tree_hosts([w.address for w in workers], workers[0].address)
    assert tree == tuple(w.address for w in workers)  # one host each, in address order
    await c.publish_dataset(**{name: seeded, tree_name(name): tree})
    try:
        # Rank 3's parent is rank 1, which does not hold the version yet: it gets it from
        # rank 0 on the way, and both hosts keep a copy; ranks 2 and 4 have none.
        await _batch(c, plugin, workers[3], 0, seeded.key)
        assert [bool(_copies(dirs[w.address])) for w in workers] == [
            False, True, False, True, False]
        assert workers[3].plugins[plugin.name].weight_sources == [(0, "tree")]
        assert workers[1].plugins[plugin.name].weight_sources == []  # it served, not ran
        # The others at once: each from its parent (rank 1 reads its host's copy), one copy
        # per host.
        await asyncio.gather(*(_batch(c, plugin, w, i + 1, seeded.key)
                               for i, w in enumerate(workers) if i != 3))
        sources = [w.plugins[plugin.name].weight_sources for w in workers]
        assert sources == [[(0, "seed")], [(0, "host-copy")], [(0, "tree")], [(0, "tree")],
                           [(0, "tree")]]
        assert [len(_copies(dirs[w.address])) for w in workers] == [0, 1, 1, 1, 1]
    finally:
        await c.unpublish_dataset(name)
        await c.unpublish_dataset(tree_name(name))
        await c.unregister_worker_plugin(plugin.name)


@pytest.mark.timeout(120)
@gen_cluster(client=True, nthreads=HOSTS[:3], timeout=100)
async def test_a_child_whose_parent_is_gone_fetches_from_the_seed(c, s, a, b, w3, store,
                                                                 tmp_path):
    plugin, seeded, dirs = await _setup(c, (a, b, w3), store, tmp_path)
    name = weights_name(plugin.name, 0)
    # Rank 3 (w3) has rank 1 as its parent: a host whose worker left (nothing listens there).
    gone = "tcp://127.0.0.9:9"
    await c.publish_dataset(**{name: seeded, tree_name(name): (a.address, gone, b.address,
                                                                  w3.address)})
    try:
        await _batch(c, plugin, w3, 0, seeded.key)
        assert w3.plugins[plugin.name].weight_sources == [(0, "dask")]
        assert _copies(dirs[w3.address])
        # Rank 2 (b) has the seed as its parent.
        await _batch(c, plugin, b, 1, seeded.key)
        assert b.plugins[plugin.name].weight_sources == [(0, "tree")]
    finally:
        await c.unpublish_dataset(name)
        await c.unpublish_dataset(tree_name(name))
        await c.unregister_worker_plugin(plugin.name)
