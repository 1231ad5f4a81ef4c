"""``batches_per_task``: one Dask task collects k consecutive batches of a stream.

Real clusters, real envs (``daskrl.testing``'s counting envs: every stored transition is
checkable), real stores; faults injected for real (SIGKILL of a worker process).
"""

from __future__ import annotations

import functools
import os
import signal

import numpy as np
import pytest
from distributed import Client, get_task_stream
from scheduler_kills import KillOnResult

import daskrl
from daskrl.deploy import local_cluster
from daskrl.errors import ConfigError
from daskrl.testing import SlowEnv, TagPolicy, check_episode_continuity

COUNTING = "daskrl.testing:Counting-v0"


def _check_store(url: str, n_batches: int, frames: int) -> None:
    """Exactly the expected batches, each once; every transition real; episodes continuous."""
    store = daskrl.open_store(url)
    assert store.batch_ids() == list(range(n_batches))
    assert store.frames == frames
    seen: dict[int, set[int]] = {}
    for bid in store.batch_ids():
        b = store.load(bid)
        obs, nxt = b["observation"].numpy(), b["next_observation"].numpy()
        assert np.array_equal(nxt, obs + np.array([0, 1]))  # counting envs: real transitions
        for eid, step in zip(b["episode_id"].numpy().ravel(), b["step"].numpy().ravel()):
            steps = seen.setdefault(int(eid), set())
            assert int(step) not in steps, (eid, step)  # no transition stored twice
            steps.add(int(step))
    check_episode_continuity(store)


def _collect_tasks(client, sync: bool, url: str, **options):
    """Iterate a collector, publishing a new weights version after every handle; return the
    handles and the keys of the collection tasks the scheduler ran."""
    handles = []
    with (get_task_stream(client) as ts,
          daskrl.Collector(COUNTING, TagPolicy(), url, client=client, envs_per_worker=2,
                           frames_per_batch=6, total_frames=76, num_workers=2, sync=sync,
                           **options) as collector):
        for handle in collector:
            handles.append(handle)
            collector.update_weights(TagPolicy())
        summary = collector.summary()
    keys = {t["key"] for t in ts.data if str(t["key"]).startswith("daskrl-collect-")}
    return handles, keys, summary


def _by_stream(url: str) -> dict[int, list[int]]:
    records = daskrl.open_store(url).records()
    streams: dict[int, list[int]] = {}
    for bid in sorted(records):
        streams.setdefault(records[bid]["stream"], []).append(bid)
    return streams


def test_sync_rounds_hold_k_batches_per_stream_on_one_weights_version(client, tmp_path):
    # 76 frames in batches of 6 (T=3, E=2): 12 full batches and one of 4 frames. Two streams,
    # k=3: rounds of 6 batches (one task of 3 per stream), then a last round of one batch.
    url = str(tmp_path / "s")
    handles, keys, summary = _collect_tasks(client, True, url, batches_per_task=3)
    assert [h.batch_id for h in handles] == list(range(13))  # every batch once, in order
    assert [h.frames for h in handles] == [6] * 12 + [4]  # exact frame budget
    assert summary["frames"] == 76 and summary["batches"] == 13
    assert len(keys) == 5  # 2 + 2 + 1 tasks, not 13
    # One weights version per round: the round's tasks got the newest version when the
    # learner asked for the round's first handle (one version published per handle).
    assert [h.weights_version for h in handles] == [0] * 6 + [6] * 6 + [12]
    assert [h.policy_lag for h in handles] == [0, 1, 2, 3, 4, 5] * 2 + [0]
    streams = _by_stream(url)
    assert streams == {0: [0, 2, 4, 6, 8, 10, 12], 1: [1, 3, 5, 7, 9, 11]}
    _check_store(url, 13, 76)  # episodes run on across batches and across tasks


def test_async_tasks_hand_over_their_handles_in_batch_order(client, tmp_path):
    url = str(tmp_path / "s")
    handles, keys, summary = _collect_tasks(client, False, url, batches_per_task=3,
                                            batches_in_flight=1)
    assert sorted(h.batch_id for h in handles) == list(range(13))
    assert sum(h.frames for h in handles) == 76 == summary["frames"]
    assert len(keys) == 5  # ceil(13 / 3): the last task holds one batch
    streams = _by_stream(url)
    order = [h.batch_id for h in handles]
    for ids in streams.values():  # each stream's handles come in its batch order
        assert [b for b in order if b in ids] == ids
    # A task's batches share the weights version its task was submitted with.
    version = {h.batch_id: h.weights_version for h in handles}
    for ids in streams.values():
        for i in range(0, len(ids), 3):
            assert len({version[b] for b in ids[i:i + 3]}) == 1
    _check_store(url, 13, 76)


def test_one_batch_per_task_is_todays_collection(client, tmp_path):
    url = str(tmp_path / "s")
    handles, keys, _ = _collect_tasks(client, True, url)
    assert [h.batch_id for h in handles] == list(range(13))
    assert len(keys) == 13
    _check_store(url, 13, 76)


def _counting_next_handle(client, monkeypatch) -> list[int]:
    """Count the learner's trips to the event loop for a handle (``client.sync`` of
    ``next_handle``); the client works as before."""
    calls: list[int] = []
    real = client.sync

    def sync(fn, *args, **kwargs):
        if getattr(fn, "__name__", "") == "next_handle":
            calls.append(1)
        return real(fn, *args, **kwargs)

    monkeypatch.setattr(client, "sync", sync)
    return calls


def test_fetched_handles_of_a_task_are_handed_over_without_a_trip_to_the_event_loop(
        client, tmp_path, monkeypatch):
    # 72 frames in batches of 6: two rounds of two tasks of three batches. A round's handles
    # arrive with its tasks; only the first of each task (at most) needs the event loop, plus
    # the last call that finds the collection done.
    calls = _counting_next_handle(client, monkeypatch)
    url = str(tmp_path / "s")
    with daskrl.Collector(COUNTING, TagPolicy(), url, client=client, envs_per_worker=2,
                          frames_per_batch=6, total_frames=72, num_workers=2,
                          batches_per_task=3) as collector:
        handles = list(collector)
    assert [h.batch_id for h in handles] == list(range(12))
    assert len(calls) <= 2 * 2 + 1 < len(handles)
    assert [h.policy_lag for h in handles] == [0] * 12
    assert collector.summary()["batches"] == 12  # each counted once
    _check_store(url, 12, 72)


def test_stale_handles_of_a_task_are_dropped_in_the_learners_thread_too(client, tmp_path,
                                                                         monkeypatch):
    # async, k = 3, max_policy_lag = 0, a new version after every handle: once a task's first
    # handle is handed over, its other two are stale. They are dropped where they are taken
    # (without the event loop) and their frames collected again.
    calls = _counting_next_handle(client, monkeypatch)
    url = str(tmp_path / "s")
    handles = []
    with daskrl.Collector(COUNTING, TagPolicy(), url, client=client, envs_per_worker=2,
                          frames_per_batch=6, total_frames=36, num_workers=1, sync=False,
                          batches_in_flight=1, batches_per_task=3,
                          max_policy_lag=0) as collector:
        for handle in collector:
            handles.append(handle)
            collector.update_weights(TagPolicy())
        summary = collector.summary()
    assert [h.policy_lag for h in handles] == [0] * len(handles)
    assert sum(h.frames for h in handles) == 36 == summary["frames"]
    assert summary["dropped_stale"] > 0
    assert summary["dropped_stale"] + len(handles) == len(daskrl.open_store(url).batch_ids())
    assert len(calls) <= len(handles) + 1
    _check_store(url, len(handles) + summary["dropped_stale"],
                 36 + summary["dropped_frames"])


def test_submit_refuses_several_batches_per_task(client, tmp_path):
    with daskrl.Collector(COUNTING, TagPolicy(), str(tmp_path / "s"), client=client,
                          envs_per_worker=2, frames_per_batch=6, total_frames=12,
                          batches_per_task=2) as collector:
        with pytest.raises(ConfigError, match="batches_per_task=2"):
            collector.submit()
        assert len(list(collector)) == 2  # iterating works


@pytest.mark.faults
@pytest.mark.parametrize("sync", [True, False])
def test_worker_killed_mid_task_costs_a_retry_only(tmp_path, sync):
    with local_cluster(2) as cluster, Client(cluster, set_as_default=False) as client:
        url = str(tmp_path / "s")
        env = functools.partial(SlowEnv, 0.002)
        handles = []
        with daskrl.Collector(env, TagPolicy(), url, client=client, envs_per_worker=2,
                              frames_per_batch=40, total_frames=40 * 20, sync=sync,
                              batches_per_task=4) as collector:
            for handle in collector:
                handles.append(handle)
                if len(handles) == 3:
                    victim = handle.worker
                    pid = client.run(os.getpid, workers=[victim])[victim]
                    os.kill(pid, signal.SIGKILL)
        assert sorted(h.batch_id for h in handles) == list(range(20))  # each handed over once
        assert sum(h.frames for h in handles) == 40 * 20
    _check_store(url, 20, 40 * 20)  # each committed once


@pytest.mark.faults
def test_task_rerun_after_its_commits_keeps_the_originals_and_hands_each_over_once(tmp_path):
    # One stream, k=3: the task of batches 3-5 commits all three, then its worker dies before
    # the learner has the handles. Dask runs the task again on the other worker: each write
    # finds the commit and returns the committed batch, so nothing is committed or handed
    # over twice, and the stream's later batches do not continue the discarded re-run.
    with local_cluster(2) as cluster, Client(cluster, set_as_default=False) as client:
        killer = KillOnResult(cluster, 3)
        cluster.scheduler.add_plugin(killer, name="kill-on-result")
        url = str(tmp_path / "s")
        env = functools.partial(SlowEnv, 0.001, 7)
        with daskrl.Collector(env, TagPolicy(), url, client=client, envs_per_worker=2,
                              frames_per_batch=20, total_frames=200, num_workers=1,
                              batches_per_task=3) as c:
            handles = list(c)
        assert killer.killed is not None
        assert [h.batch_id for h in handles] == list(range(10))
        assert {h.worker for h in handles[3:6]} == {killer.killed}  # the originals were kept
        assert {h.worker for h in handles[6:]} != {killer.killed}
    _check_store(url, 10, 200)


def test_resume_continues_with_another_batches_per_task(client, tmp_path):
    url = str(tmp_path / "s")
    opts = dict(client=client, envs_per_worker=2, frames_per_batch=6, total_frames=76,
                num_workers=2)
    with daskrl.Collector(COUNTING, TagPolicy(), url, batches_per_task=2, **opts) as c:
        first = [h for _, h in zip(range(5), c)]
    with daskrl.Collector(COUNTING, TagPolicy(), url, batches_per_task=3, resume=True,
                          **opts) as c:
        rest = list(c)
    store = daskrl.open_store(url)
    assert store.frames == 76  # exact: what the first run committed, then what was left
    assert sum(h.frames for h in first) + sum(h.frames for h in rest) <= 76
    assert len(set(store.batch_ids())) == len(store.batch_ids())
    check_episode_continuity(store)
