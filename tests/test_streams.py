"""Streams: one long-lived task per stream collects batch after batch, and its handles reach
the learner over its own channel, not through the scheduler.

Real clusters, real envs (``daskrl.testing``'s counting envs: every stored transition is
checkable), real stores; faults injected for real (SIGKILL of a worker process).
"""

from __future__ import annotations

import functools
import itertools
import os
import signal
import time

import pytest
from counting_stores import check_counting_store
from distributed import Client

import daskrl
from daskrl.deploy import local_cluster
from daskrl.testing import SlowEnv, TagPolicy

COUNTING = "daskrl.testing:Counting-v0"


def _collect(client, rounds: bool, url: str, **options):
    """Iterate a collector, publishing a new weights version after every handle; return the
    handles, the keys of the tasks the scheduler moved meanwhile, and its summary."""
    handles = []
    since = time.time()
    with daskrl.Collector(COUNTING, TagPolicy(), url, client=client, envs_per_worker=2,
                          frames_per_batch=6, total_frames=76, num_workers=2, rounds=rounds,
                          **options) as collector:
        for handle in collector:
            handles.append(handle)
            collector.update_weights(TagPolicy())
        summary = collector.summary()
    return handles, client.run_on_scheduler(_keys_since, since), summary


def _keys_since(since: float, dask_scheduler=None) -> set[str]:
    """The daskrl task keys the scheduler moved since ``since`` (its transition log)."""
    return {str(entry[0]) for entry in dask_scheduler.transition_log
            if entry[-1] >= since and str(entry[0]).startswith("daskrl-")}


def _by_stream(url: str) -> dict[int, list[int]]:
    records = daskrl.open_store(url).records()
    streams: dict[int, list[int]] = {}
    for bid in sorted(records):
        streams.setdefault(records[bid]["stream"], []).append(bid)
    return streams


def test_sync_rounds_come_from_one_task_per_stream_in_batch_order(client, tmp_path):
    # 76 frames in batches of 6 (T=3, E=2): 12 full batches and one of 4 frames; two streams.
    url = str(tmp_path / "s")
    handles, keys, summary = _collect(client, True, url)
    assert [h.batch_id for h in handles] == list(range(13))  # every batch once, in order
    assert [h.frames for h in handles] == [6] * 12 + [4]  # exact frame budget
    assert summary["frames"] == 76
    # The scheduler ran one task per stream for all 13 batches, and no task per batch.
    assert not {k for k in keys if k.startswith("daskrl-collect-")}
    assert len({k for k in keys if k.startswith("daskrl-stream-")}) == 2
    # A round's batches share a weights version: the one newest when the round began.
    for first in range(0, 12, 2):
        assert handles[first].weights_version == handles[first + 1].weights_version
    assert _by_stream(url) == {0: list(range(0, 13, 2)), 1: list(range(1, 13, 2))}
    check_counting_store(url, 13, 76)


def test_async_streams_run_on_the_newest_weights_within_the_credits(client, tmp_path):
    url = str(tmp_path / "s")
    handles, keys, summary = _collect(client, False, url, batches_in_flight=1)
    assert sorted(h.batch_id for h in handles) == list(range(13))
    assert sum(h.frames for h in handles) == 76 == summary["frames"]
    assert len({k for k in keys if k.startswith("daskrl-stream-")}) == 2
    assert not {k for k in keys if k.startswith("daskrl-collect-")}
    # One credit per stream: a batch is given when the learner took the stream's last one (on
    # the version then newest), and runs on the newest version announced before it starts:
    # along a stream, versions never go back, and each batch's is at least the version the
    # learner had published when it took the stream's previous batch.
    records = daskrl.open_store(url).records()
    by_id = {h.batch_id: h for h in handles}
    for stream, ids in _by_stream(url).items():
        versions = [by_id[b].weights_version for b in ids]
        assert versions == sorted(versions), (stream, versions)
        for prev, nxt in itertools.pairwise(ids):
            taken_at = by_id[prev].weights_version + by_id[prev].policy_lag
            assert by_id[nxt].weights_version >= taken_at, (prev, nxt, records[nxt])
    check_counting_store(url, 13, 76)


def _slow_collector(client, url: str, batches: int, rounds: bool, **options) -> daskrl.Collector:
    """``batches`` batches of 40 frames (2 envs of a slightly slow counting env): long enough
    for a fault to land mid-collection."""
    return daskrl.Collector(functools.partial(SlowEnv, 0.002), TagPolicy(), url, client=client,
                            envs_per_worker=2, frames_per_batch=40, total_frames=40 * batches,
                            rounds=rounds, **options)


@pytest.mark.faults
@pytest.mark.parametrize("rounds", [True, False])
def test_worker_killed_mid_stream_costs_a_retry_only(tmp_path, rounds):
    with local_cluster(2) as cluster, Client(cluster, set_as_default=False) as client:
        url = str(tmp_path / "s")
        handles = []
        with _slow_collector(client, url, 20, rounds) as collector:
            for handle in collector:
                handles.append(handle)
                if len(handles) == 3:
                    victim = handle.worker
                    pid = client.run(os.getpid, workers=[victim])[victim]
                    os.kill(pid, signal.SIGKILL)
            assert collector._run is not None and collector._run.streams.restarts >= 1
        assert sorted(h.batch_id for h in handles) == list(range(20))  # each handed over once
        assert sum(h.frames for h in handles) == 40 * 20
    check_counting_store(url, 20, 40 * 20)  # each committed once


def test_the_learner_refuses_a_stream_without_the_token_or_of_another_epoch(client, tmp_path):
    from distributed.comm import connect

    with daskrl.Collector(COUNTING, TagPolicy(), str(tmp_path / "s"), client=client,
                          envs_per_worker=2, frames_per_batch=6, total_frames=None) as collector:
        it = iter(collector)
        next(it)
        address, token = collector.learner_address, collector._running().streams.token

        async def hello(msg):
            comm = await connect(address, **client.security.get_connection_args("client"))
            try:
                await comm.write(msg)
                return await comm.read()
            finally:
                comm.abort()

        hello_of = {"op": "hello", "token": token, "stream": 0, "epoch": 0, "worker": "x"}
        for msg in ({**hello_of, "token": "a guess"}, {**hello_of, "epoch": 5},
                    {**hello_of, "stream": 99}, {"op": "handle", "batch_id": 0}):
            assert client.sync(hello, msg) == {"op": "refused"}, msg
        assert collector._running().streams.restarts == 0  # the real streams ran on
        assert next(it).batch_id >= 1


@pytest.mark.faults
@pytest.mark.parametrize("rounds", [True, False])
def test_a_joining_worker_takes_a_stream_over_and_a_retiring_one_hands_its_over(tmp_path, rounds):
    with local_cluster(1) as cluster, Client(cluster, set_as_default=False) as client:
        url = str(tmp_path / "s")
        handles = []
        with _slow_collector(client, url, 40, rounds, num_workers=2) as collector:
            first = client.scheduler_info()["workers"].keys()
            for handle in collector:
                handles.append(handle)
                if len(handles) == 4:  # both streams on the one worker: one more joins
                    cluster.scale(2)
                    client.wait_for_workers(2, timeout=120)
                if len(handles) == 24:  # the first worker retires: its stream moves again
                    client.retire_workers(list(first))
            streams = collector._running().streams
            assert streams.restarts >= 2  # a move to the new worker, a move off the old one
        workers = [h.worker for h in handles]
        [old] = first
        joined = {w for w in workers[8:24]} - {old}
        assert joined, workers  # the joining worker collected batches before the retirement
        assert old not in workers[30:], workers  # none on the retired worker after it left
        assert sorted(h.batch_id for h in handles) == list(range(40))  # each handed over once
        assert sum(h.frames for h in handles) == 40 * 40
    check_counting_store(url, 40, 40 * 40)
