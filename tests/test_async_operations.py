"""An asynchronous client's operations do the same work as a synchronous client's, and
``update_weights`` hands back a plain awaitable whose versions stay in call order, on in-process
clusters (``processes=False``: the workers share this process)."""

from __future__ import annotations

import asyncio
import glob
import inspect
import logging
import os
import re

import pytest
import torch
from distributed import Client, Future, LocalCluster

import daskrl
from daskrl.errors import CollectorClosedError
from daskrl.testing import TagPolicy
from daskrl.weights._segments import shared_memory_dir

COUNTING = "daskrl.testing:Counting-v0"
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def _in_process(test):
    """Run ``test(cluster, client)`` on a fresh 2-worker in-process cluster, with an
    asynchronous client."""
    async def main() -> None:
        async with (LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                 asynchronous=True, dashboard_address=None,
                                 silence_logs=logging.ERROR) as cluster,
                    Client(cluster, asynchronous=True) as client):
            await test(cluster, client)
    asyncio.run(main())


def _segments() -> list[str]:
    return glob.glob(os.path.join(shared_memory_dir(), f"daskrl-weights-{os.getpid()}-*"))


def _tag(policy: TagPolicy, value: int) -> TagPolicy:
    with torch.no_grad():
        policy.tag.fill_(value)
    return policy


def test_submit_scatters_weights_lost_with_their_worker_again(tmp_path):
    """``submit()`` with an asynchronous client first scatters again a weights version whose
    only copy died with its worker, as with a synchronous client."""
    async def test(cluster: LocalCluster, client: Client) -> None:
        async with daskrl.Collector(COUNTING, TagPolicy(), str(tmp_path / "s"), client=client,
                                    shared_memory=False, envs_per_worker=2,
                                    frames_per_batch=10, total_frames=None) as collector:
            lost = collector.weights_ref(0)
            assert isinstance(lost, str)  # the key of the version scattered to its seed
            held = await client.run(lambda dask_worker: lost in dask_worker.data)
            [seed] = [address for address, has in held.items() if has]
            [name] = [n for n, w in cluster.workers.items() if w.address == seed]
            await cluster.workers[name].close()  # Dask cannot compute scattered data again
            state = Future(lost, client)  # the publisher's future of it, as seen by the client
            while state.status not in ("lost", "cancelled"):  # lost data is cancelled
                await asyncio.sleep(0.01)
            submitted = collector.submit()
            assert inspect.iscoroutine(submitted)  # what distributed returns: an awaitable
            future = await submitted
            handle = collector.hand_over(await future)
            assert (handle.batch_id, handle.weights_version) == (0, 0)
            again = collector.weights_ref(0)
            assert again != lost
            assert any((await client.run(lambda dask_worker: again in dask_worker.data)).values())
    _in_process(test)


def test_update_weights_returns_an_awaitable_and_versions_keep_call_order(tmp_path):
    async def test(cluster: LocalCluster, client: Client) -> None:
        policy = TagPolicy()
        async with daskrl.Collector(COUNTING, policy, str(tmp_path / "s"), client=client,
                                    envs_per_worker=2, frames_per_batch=10,
                                    total_frames=None) as collector:
            first = collector.update_weights(_tag(policy, 1))  # copied now
            second = collector.update_weights(_tag(policy, 2))
            _tag(policy, 9)  # the learner changes its weights in place: no copy sees it
            assert inspect.iscoroutine(first) and inspect.iscoroutine(second)
            assert collector.weights_version == 0  # nothing published until awaited
            assert await second == 2  # version 1 first: no version is skipped
            assert collector.weights_version == 2
            assert await first == 1  # published already
            handle = collector.hand_over(await (await collector.submit()))
            assert handle.weights_version == 2
            assert (handle.load(keys=["tag"])["tag"] == 2).all()  # the copy taken at the call
            # an update never awaited (its coroutine dropped): the next one awaited publishes
            # it first, under its own number, then itself
            collector.update_weights(_tag(policy, 3)).close()
            assert await collector.update_weights(_tag(policy, 4)) == 4
            handle = collector.hand_over(await (await collector.submit()))
            assert handle.weights_version == 4 and (handle.load(keys=["tag"])["tag"] == 4).all()
            # an update called while another is being published (between making its version
            # the newest and loading it everywhere) takes the next number, none skipped
            loading = asyncio.ensure_future(collector.update_weights(_tag(policy, 5), wait=True))
            while collector.weights_version < 5:
                await asyncio.sleep(0)
            assert not loading.done()
            assert await collector.update_weights(_tag(policy, 6)) == 6
            assert await loading == 5
            left = collector.update_weights(_tag(policy, 7))
        assert collector.weights_version == 6 and not _segments()  # its copy is freed
        with pytest.raises(CollectorClosedError, match=re.escape(
                "this collector was closed before these weights were published")):
            await left
    _in_process(test)


def test_a_collector_given_sync_collects_first_done(tmp_path):
    async def test(cluster: LocalCluster, client: Client) -> None:
        with pytest.warns(DeprecationWarning, match=re.escape("use rounds=")):
            collector = daskrl.Collector(COUNTING, TagPolicy(), str(tmp_path / "s"),
                                         client=client, config=daskrl.CollectorConfig(),
                                         sync=False, envs_per_worker=2, frames_per_batch=10,
                                         total_frames=40)
        async with collector:
            assert collector.config.rounds is False
            assert [h.frames async for h in collector] == [10] * 4
            with pytest.warns(DeprecationWarning, match=re.escape(
                    "Collector.run is deprecated: use Collector.run_number (same value).")):
                assert collector.run == collector.run_number == 0
    _in_process(test)
