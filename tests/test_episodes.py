"""Episodes across batches: ``daskrl.data.episodes(store)`` after deletions, and the continuity checker
(``daskrl.testing.check_episode_continuity``) on real stores and on stores broken on purpose.

The shared store is written on an in-process cluster: the tests that read it are in the
cluster tier (marked: the tier rule cannot see the fixture's cluster)."""

from __future__ import annotations

import logging
import re
import shutil

import numpy as np
import pytest
import torch
from distributed import Client, LocalCluster

import daskrl
import daskrl.data
from daskrl.store import TrajectoryStore
from daskrl.testing import TagPolicy, check_episode_continuity

EPISODE = 5  # CountingEnv: observation [episode, t], episodes of 5 steps


@pytest.fixture(scope="module")
def store_url(tmp_path_factory):
    """One stream of [T=2, E=2] batches: every episode spans three batches. Then a second run
    with ``reset_at_each_iter`` (every episode cut at each batch's end)."""
    url = str(tmp_path_factory.mktemp("episodes") / "store")
    with (LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                       dashboard_address=None, silence_logs=logging.ERROR) as cluster,
          Client(cluster, set_as_default=False) as client):
        with daskrl.Collector("daskrl.testing:Counting-v0", TagPolicy(), url, client=client,
                              envs_per_worker=2, frames_per_batch=4, total_frames=40,
                              num_workers=1) as c:
            list(c)
        with daskrl.Collector("daskrl.testing:Counting-v0", TagPolicy(), url, client=client,
                              envs_per_worker=2, frames_per_batch=6, total_frames=12,
                              num_workers=1, reset_at_each_iter=True) as c:
            list(c)
    return url


def _copy(store_url, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(store_url, dst)
    return daskrl.open_store(str(dst), writable=True)


@pytest.mark.cluster
def test_a_real_store_is_continuous(store_url):
    report = check_episode_continuity(daskrl.open_store(store_url))
    assert report.batches == 12 and report.transitions == 52
    assert report.ended == 8 and report.cut == 2 * 2  # run 0 ends all (20 steps per env)


@pytest.mark.cluster
def test_episodes_whose_first_batch_was_deleted_are_incomplete(store_url, tmp_path):
    store = _copy(store_url, tmp_path)
    before = {e.episode_id: e for e in daskrl.data.episodes(store, ["step"], complete_only=False)}
    assert all(e.complete for e in before.values() if e.batch_ids[-1] < 10)
    store.delete_batches([0])  # episodes 0 and 1 of each env started there
    eps = list(daskrl.data.episodes(store, ["step", "reward"]))
    assert eps and all(e.complete for e in eps)
    for ep in eps:
        assert torch.equal(ep.data["step"], torch.arange(EPISODE)) and ep.total_reward == 15.0
    everything = {e.episode_id: e for e in daskrl.data.episodes(store, ["reward"], complete_only=False)}
    first = [e for e in everything.values() if e.batch_ids[0] == 1]
    assert len(first) == 2 and not any(e.complete for e in first)
    assert all(e.length == EPISODE - 2 for e in first)  # steps 2, 3, 4 only
    assert "step" not in first[0].data  # not asked for
    assert {e.episode_id for e in eps} == {i for i, e in before.items()
                                           if e.complete and e.batch_ids[0] != 0}


@pytest.mark.cluster
def test_episodes_with_a_deleted_middle_batch_are_incomplete(store_url, tmp_path):
    store = _copy(store_url, tmp_path)
    spanning = [e for e in daskrl.data.episodes(store, ["step"]) if e.batch_ids[1:-1] == (1,)]
    assert len(spanning) == 2
    store.delete_batches([1])
    ids = {e.episode_id for e in spanning}
    assert not ids & {e.episode_id for e in daskrl.data.episodes(store, ["step"])}
    holed = [e for e in daskrl.data.episodes(store, ["step"], complete_only=False) if e.episode_id in ids]
    assert len(holed) == len(spanning) and not any(e.complete for e in holed)
    assert all(e.length == EPISODE - 2 for e in holed)  # steps 0, 1 and 4: batch 1 held 2, 3


def _rewrite(src, dst_url, change=None, skip=()):
    """Copy ``src`` batch by batch into a new store, with ``change(batch_id, arrays, meta)``
    applied: a store broken on purpose, written as a writer would."""
    dst = TrajectoryStore(dst_url, read_only=False)
    dst.initialize()
    for run in src.runs().values():
        dst.register_run(run["settings"])
    for bid, rec in src.records().items():
        if bid in skip:
            continue
        arrays = {k: v.numpy().copy() for k, v in src.load(bid).items()}
        meta = {k: v for k, v in rec.items() if k not in ("path", "batch_id")}
        if change is not None:
            change(bid, arrays, meta)
        dst.write_batch(bid, arrays, meta, compression="none")
    return daskrl.open_store(dst_url)


def _breaks(store):
    with pytest.raises(AssertionError) as info:
        check_episode_continuity(store)
    return str(info.value)


@pytest.mark.cluster
def test_checker_finds_episodes_whose_first_steps_are_in_no_batch(store_url, tmp_path):
    src = daskrl.open_store(store_url)
    assert check_episode_continuity(_rewrite(src, str(tmp_path / "same"))).batches == 12
    text = _breaks(_rewrite(src, str(tmp_path / "a"), skip={0}))
    assert re.search(r"episode \d+ \(batch 1, env 0, t=0\): starts at step 2; its first steps "
                     r"are in no batch", text), text


@pytest.mark.cluster
def test_checker_finds_a_continuation_that_is_not_the_stream_s_last_state(store_url, tmp_path):
    src = daskrl.open_store(store_url)

    def jump(bid, arrays, meta):
        if bid == 3:  # env 0 "continues" from a state it never reached
            arrays["observation"][0, 0] += np.array([0, 7], arrays["observation"].dtype)
            arrays["next_observation"][0, 0] += np.array([0, 7], arrays["observation"].dtype)

    text = _breaks(_rewrite(src, str(tmp_path / "b"), jump))
    assert "(batch 3, env 0, t=0): its observation is not the next_observation its previous " \
           "step in batch 2 ended with" in text, text


@pytest.mark.cluster
def test_checker_finds_a_continuation_across_streams(store_url, tmp_path):
    src = daskrl.open_store(store_url)

    def other_stream(bid, arrays, meta):
        if bid == 2:
            meta["stream"] = 1

    text = _breaks(_rewrite(src, str(tmp_path / "c"), other_stream))
    assert "continues from batch 1, which is not the batch before 3 in its stream (2)" in text \
        or "continues from batch 2, which is not the batch before 3 in its stream (1)" in text, text


@pytest.mark.cluster
def test_checker_finds_a_step_stored_twice_and_a_missing_end(store_url, tmp_path):
    src = daskrl.open_store(store_url)

    def twice(bid, arrays, meta):
        if bid == 5:
            arrays["step"][1, 1] = arrays["step"][0, 1]

    assert "are not consecutive" in _breaks(_rewrite(src, str(tmp_path / "d"), twice))

    def no_end(bid, arrays, meta):
        if bid == 2:
            arrays["terminated"][:] = False

    text = _breaks(_rewrite(src, str(tmp_path / "e"), no_end))
    assert "although the one before it did not end" in text or "stops at t=" in text, text


def test_a_batch_cancelled_while_it_runs_leaves_its_stream_continuous(client, tmp_path):
    import time

    def executing() -> set[str]:
        keys = client.run(lambda dask_worker: [str(ts.key) for ts in dask_worker.state.executing])
        return {k for ks in keys.values() for k in ks}

    def poll(condition) -> None:
        deadline = time.monotonic() + 60
        while not condition():
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.02)

    url = str(tmp_path / "s")
    # One stream; about 0.5 s per batch: 25 steps of 2 envs sleeping 10 ms each.
    with daskrl.Collector("daskrl.testing:Counting-v0", TagPolicy(), url, client=client,
                          envs_per_worker=2, frames_per_batch=50, total_frames=None,
                          num_workers=1, env_kwargs={"length": 7, "delay": 0.01}) as c:
        assert c.hand_over(c.submit()).batch_id == 0
        running = c.submit()  # batch 1: its envs continue from batch 0
        poll(lambda: running.key in executing())
        running.cancel()  # while it runs: stopped before its write
        poll(lambda: running.key not in executing())
        later = [c.hand_over(c.submit()) for _ in range(2)]  # batches 2 and 3, same stream
        assert [h.batch_id for h in later] == [2, 3]
    store = daskrl.open_store(url)
    assert store.batch_ids() == [0, 2, 3]
    report = check_episode_continuity(store)  # batch 2 does not continue the unwritten batch 1
    assert report.transitions == 150
