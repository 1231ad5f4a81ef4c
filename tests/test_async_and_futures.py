"""Async collection, policy lag, backpressure and the futures API, on a real LocalCluster.
(Their settings' checks, before any cluster starts: tests/unit/test_async_and_futures.py.)"""

from __future__ import annotations

import asyncio
import re
import threading
import time

import pytest
import torch
from distributed import Client, as_completed, wait

import daskrl
from daskrl import DaskrlError
from daskrl.testing import TagPolicy

COUNTING = "daskrl.testing:Counting-v0"


def _publish_tag(collector: daskrl.Collector, policy: TagPolicy) -> int:
    """Publish a new version whose output ``tag`` is that version's number."""
    with torch.no_grad():
        policy.tag.fill_(collector.weights_version + 1)
    return collector.update_weights(policy)


def _assert_tags_match(handle: daskrl.BatchHandle) -> None:
    tags = handle.load(keys=["tag"])["tag"]
    assert (tags == handle.weights_version).all(), (handle.batch_id, handle.weights_version, tags)


def test_new_weights_reach_the_next_batch_while_others_are_in_flight(client, tmp_path):
    policy = TagPolicy()
    # A slow env, so that the stream's other batches are really still queued or running.
    with daskrl.Collector(COUNTING, policy, str(tmp_path / "s"), client=client, rounds=False,
                          envs_per_worker=2, frames_per_batch=20, total_frames=240,
                          env_kwargs={"delay": 0.002}) as collector:
        ahead = collector.num_streams * collector.config.batches_in_flight - 1
        handles = []
        for k, handle in enumerate(collector):
            newest = collector.weights_version
            assert handle.policy_lag == newest - handle.weights_version, handle
            # The other batches stay in flight: submitted so far, minus those handed over.
            assert collector.in_flight == min(12, ahead + 1 + k) - (k + 1)
            handles.append(handle)
            assert _publish_tag(collector, policy) == newest + 1  # no draining: returns at once
    assert sorted(h.batch_id for h in handles) == list(range(12))
    for h in handles:
        _assert_tags_match(h)
        # Batch b >= 4 was submitted right after the learner's (b - 3)-th update.
        assert h.weights_version == max(0, h.batch_id - ahead), h
    # The lag is real: the last of the 4 first batches (version 0) is handed over 4th or later.
    assert max(h.policy_lag for h in handles) >= ahead, [h.policy_lag for h in handles]


@pytest.mark.parametrize("rounds", [True, False])
def test_max_policy_lag_drops_stale_batches_and_recollects_their_frames(client, tmp_path, rounds):
    policy = TagPolicy()
    with daskrl.Collector(COUNTING, policy, str(tmp_path / "s"), client=client, rounds=rounds,
                          envs_per_worker=2, frames_per_batch=10, total_frames=100,
                          max_policy_lag=0 if rounds else 1) as collector:
        handles = []
        for handle in collector:
            handles.append(handle)
            _publish_tag(collector, policy)
        summary = collector.summary()
    limit = 0 if rounds else 1
    assert all(h.policy_lag <= limit for h in handles)
    assert sum(h.frames for h in handles) == 100 == summary["frames"]  # still exact
    assert summary["dropped_stale"] > 0
    store = daskrl.open_store(str(tmp_path / "s"))
    # Dropped batches stay committed (real data); the learner never saw them.
    assert len(store) == len(handles) + summary["dropped_stale"]
    assert store.frames == 100 + summary["dropped_frames"]
    seen = {h.batch_id for h in handles}
    dropped = [h for h in store if h.batch_id not in seen]
    assert len(dropped) == summary["dropped_stale"]
    for h in handles:
        _assert_tags_match(h)


def test_a_slow_learner_does_not_let_the_store_run_ahead(client, tmp_path):
    url = str(tmp_path / "s")
    with daskrl.Collector(COUNTING, TagPolicy(), url, client=client, rounds=False,
                          envs_per_worker=2, frames_per_batch=10, total_frames=None,
                          batches_in_flight=2) as collector:
        bound = collector.num_streams * collector.config.batches_in_flight
        store = daskrl.open_store(url)
        handed, ahead = 0, []
        for _ in collector:
            handed += 1
            time.sleep(0.25)  # the learner is far slower than the workers
            ahead.append(len(store.batch_ids()) - handed)
            assert collector.in_flight <= bound
            if handed == 8:
                break
        time.sleep(1.0)
        ahead.append(len(store.batch_ids()) - handed)
    assert max(ahead) <= bound - 1, ahead  # without backpressure this would grow without end
    assert max(ahead) >= 1, ahead  # batches were collected ahead: the bound was what held


def test_submit_futures_with_wait_as_completed_and_hand_over(client, tmp_path):
    policy = TagPolicy()
    with daskrl.Collector(COUNTING, policy, str(tmp_path / "s"), client=client,
                          envs_per_worker=2, frames_per_batch=10, total_frames=None) as c:
        futures = [c.submit(), c.submit()]
        _publish_tag(c, policy)  # v1 while the first two are in flight
        futures += [c.submit(), c.submit()]
        with client.as_current():  # wait and as_completed use the current client
            done, not_done = wait(futures)
            assert len(done) == 4 and not not_done
            _publish_tag(c, policy)  # v2
            handles = {}
            for _, handle in as_completed(futures, with_results=True):
                assert handle.policy_lag == 0  # unknown until handed over
                handles[handle.batch_id] = c.hand_over(handle)
        assert sorted(handles) == [0, 1, 2, 3]
        assert [handles[b].weights_version for b in range(4)] == [0, 0, 1, 1]
        assert [handles[b].policy_lag for b in range(4)] == [2, 2, 1, 1]
        for h in handles.values():
            _assert_tags_match(h)
        s = c.summary()
        assert s["batches"] == 4 and s["frames"] == 40 and s["policy_lag_max"] == 2
        assert s["policy_lag_counts"] == {1: 2, 2: 2}
        # A future itself works too with a synchronous client, once.
        fut = c.submit()
        assert c.hand_over(fut).batch_id == 4
        with pytest.raises(DaskrlError, match=re.escape(
                "hand_over got batch 4, which is not a batch of this collector waiting")):
            c.hand_over(fut.result())


def _executing(client: Client) -> set[str]:
    keys = client.run(lambda dask_worker: [str(ts.key) for ts in dask_worker.state.executing])
    return {k for ks in keys.values() for k in ks}


def _poll(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_cancelled_batches_leave_nothing_in_the_store(client, tmp_path):
    url = str(tmp_path / "s")
    # About 1 s per batch: 50 vector steps of 2 envs sleeping 10 ms each.
    with daskrl.Collector(COUNTING, TagPolicy(), url, client=client, envs_per_worker=2,
                          frames_per_batch=100, total_frames=None,
                          env_kwargs={"delay": 0.01}) as c:
        first = [c.submit(), c.submit()]  # batches 0 and 1, one per worker: both busy
        queued = c.submit()  # batch 2, behind batch 0
        queued.cancel()  # before it started: never runs
        running = first[0]
        _poll(lambda: running.key in _executing(client))
        running.cancel()  # while it runs: it stops before its write
        h1 = c.hand_over(first[1].result())
        _poll(lambda: running.key not in _executing(client))  # its rollout has ended
        assert queued.cancelled() and running.cancelled()
        assert daskrl.open_store(url).batch_ids() == [h1.batch_id] == [1]
        # The collector goes on, on both streams (stream 0's envs are rebuilt).
        later = [c.hand_over(f.result()) for f in (c.submit(), c.submit())]
        assert [h.batch_id for h in later] == [3, 4]
        assert daskrl.open_store(url).batch_ids() == [1, 3, 4]
        for h in later:
            obs = h.load()["observation"]
            assert obs.shape == (50, 2, 2)
    batches = tmp_path / "s" / "batches"
    assert not list(batches.glob("000000000000-*")) and not list(batches.glob("000000000002-*"))


def test_asynchronous_client_submit_await_update_and_async_for(cluster, tmp_path):
    async def main() -> None:
        policy = TagPolicy()
        async with Client(cluster.scheduler_address, asynchronous=True) as client:
            collector = daskrl.Collector(COUNTING, policy, str(tmp_path / "a"), client=client,
                                         rounds=False, envs_per_worker=2, frames_per_batch=10,
                                         total_frames=100)
            with pytest.raises(DaskrlError, match=re.escape("is not started yet")):
                collector.submit()
            async with collector:
                future = await collector.submit()  # a coroutine, then the future
                first = collector.hand_over(await future)
                assert (first.batch_id, first.weights_version, first.policy_lag) == (0, 0, 0)
                with torch.no_grad():
                    policy.tag.fill_(1)
                assert await collector.update_weights(policy) == 1
                second = await (await collector.submit())  # after the update: version 1
                assert collector.hand_over(second).weights_version == 1
                handles = []
                async for handle in collector:
                    assert handle.policy_lag == collector.weights_version - handle.weights_version
                    handles.append(handle)
                    with torch.no_grad():
                        policy.tag.fill_(collector.weights_version + 1)
                    await collector.update_weights(policy)
                assert sorted(h.batch_id for h in handles) == list(range(2, 10))
                assert collector.summary()["frames"] == 100
            # Rounds and `collector = await Collector(...)`; close() is awaitable.
            collector = await daskrl.Collector(COUNTING, TagPolicy(), str(tmp_path / "b"),
                                               client=client, envs_per_worker=2,
                                               frames_per_batch=10, total_frames=40)
            ids = [h.batch_id async for h in collector]
            await collector.close()
            assert ids == [0, 1, 2, 3]
            with pytest.raises(daskrl.CollectorClosedError):
                collector.submit()
            assert not await client.list_datasets()  # every weights version unpublished
        for h in [first, second, *handles]:
            _assert_tags_match(h)
    asyncio.run(main())


def test_async_for_needs_an_asynchronous_client(client, tmp_path):
    message = "`async for` needs a collector with an asynchronous client"
    with (
        daskrl.Collector(COUNTING, TagPolicy(), str(tmp_path / "s"), client=client,
                         envs_per_worker=2, frames_per_batch=10, total_frames=20) as c,
        pytest.raises(DaskrlError, match=re.escape(message)),
    ):
        c.__aiter__()


def test_summary_reports_workers_episodes_and_lag(client, tmp_path):
    with daskrl.Collector(COUNTING, TagPolicy(), str(tmp_path / "s"), client=client,
                          envs_per_worker=2, frames_per_batch=20, total_frames=80,
                          env_kwargs={"length": 4}) as c:
        handles = list(c)
        s = c.summary()
    assert s["frames"] == 80 and s["batches"] == 4 and s["in_flight"] == 0
    assert s["episodes"] == sum(len(h.episode_returns) for h in handles) == 20
    assert s["mean_return"] == 1 + 2 + 3 + 4 and s["mean_length"] == 4
    assert set(s["workers"]) == {h.worker for h in handles}
    assert sum(w["frames"] for w in s["workers"].values()) == 80
    assert all(w["rollout_fps"] > 0 for w in s["workers"].values())
    assert s["policy_lag_counts"] == {0: 4} and s["dropped_stale"] == 0
    assert all(h.fps > 0 for h in handles)


def test_an_asynchronous_client_start_does_its_store_io_off_the_event_loop(cluster, tmp_path,
                                                                          monkeypatch):
    """The start's store I/O (the next run number, the probe, the run's record) runs in a
    thread: on an object store each is a request, and the event loop must stay free for the
    cluster's messages meanwhile. (The constructor's checks run where it is called.)"""
    from daskrl.store._store import TrajectoryStore

    threads: dict[str, set[int]] = {}
    for name in ("next_run", "write_probe", "clear_probes", "register_run"):
        real = getattr(TrajectoryStore, name)

        def recording(self, *args, _real=real, _name=name, **kwargs):
            threads.setdefault(_name, set()).add(threading.get_ident())
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(TrajectoryStore, name, recording)

    async def main() -> int:
        async with Client(cluster.scheduler_address, asynchronous=True) as client:
            collector = daskrl.Collector(COUNTING, TagPolicy(), str(tmp_path / "s"),
                                         client=client, envs_per_worker=2,
                                         frames_per_batch=10, total_frames=20)
            threads.clear()  # (the constructor's checks run where it is called)
            async with collector:
                ids = [h.batch_id async for h in collector]
            assert ids == [0, 1]
            return threading.get_ident()  # the event loop's thread

    loop_thread = asyncio.run(main())
    assert set(threads) == {"next_run", "write_probe", "clear_probes", "register_run"}, threads
    assert all(loop_thread not in idents for idents in threads.values()), threads
