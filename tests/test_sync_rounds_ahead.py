"""Sync rounds given ahead: the round after the current one runs behind it on each worker
while the learner does not publish; a publish takes it back, and every round still runs on
the weights version that is newest when the learner asks for its first batch."""

from __future__ import annotations

import pytest
import torch

import daskrl
from daskrl.testing import TagPolicy, check_episode_continuity

COUNTING = "daskrl.testing:Counting-v0"
pytestmark = pytest.mark.timeout(180)


def _collector(client, path, total_batches: int, policy=None) -> daskrl.Collector:
    return daskrl.Collector(COUNTING, policy or TagPolicy(), str(path), client=client,
                            envs_per_worker=2, frames_per_batch=20, total_frames=20 * total_batches)


def test_without_publishes_the_next_round_is_in_flight_with_this_one(client, tmp_path):
    with _collector(client, tmp_path / "s", 12) as collector:
        run = collector._running()
        handles = []
        for i, handle in enumerate(collector):
            handles.append(handle)
            # what an on-policy learner checks to see a round is complete: not the round ahead
            assert collector.in_flight == (1 if i % 2 == 0 else 0), i
            if i in (2, 4, 6):  # the first batch of rounds 1, 2, 3 (2 streams)
                # this round's other batch and the next round's two are in flight
                waiting = len(run._given)  # given to the streams: running or arrived
                assert waiting == 3, (i, run._given, run._done)
        assert run.rounds_ahead_dropped == 0
    assert [h.batch_id for h in handles] == list(range(12))  # each batch once, in order
    assert sum(h.frames for h in handles) == 240
    assert {h.weights_version for h in handles} == {0}
    store = daskrl.open_store(str(tmp_path / "s"))
    assert len(store) == 12
    check_episode_continuity(store)


def test_a_learner_that_publishes_every_round_gets_no_round_ahead(client, tmp_path):
    policy = TagPolicy()
    with _collector(client, tmp_path / "s", 10, policy) as collector:
        run = collector._running()
        for i, handle in enumerate(collector):
            assert handle.weights_version == i // 2
            assert len(run._given) == (1 if i % 2 == 0 else 0)
            if i % 2 == 1:
                with torch.no_grad():
                    policy.tag.fill_(collector.weights_version + 1)
                collector.update_weights(policy)
        assert run.rounds_ahead_dropped == 0


def test_a_publish_takes_the_round_ahead_back_and_rounds_keep_one_version(client, tmp_path):
    """Publishes after rounds 2 and 3 and mid-round 5: each round's batches were computed
    (tag) by the version newest when the learner asked for the round's first batch."""
    policy = TagPolicy()
    total = 16
    handles, asked = [], []
    with _collector(client, tmp_path / "s", total, policy) as collector:
        run = collector._running()
        it = iter(collector)
        for i in range(total):
            asked.append(collector.weights_version)
            handle = next(it)
            handles.append(handle)
            tags = handle.load(keys=["tag"])["tag"]
            assert (tags == handle.weights_version).all(), (handle, tags)
            if i in (5, 7, 10):  # the end of rounds 2 and 3, and mid-round 5
                with torch.no_grad():
                    policy.tag.fill_(collector.weights_version + 1)
                collector.update_weights(policy)
        assert next(it, None) is None
        # round 3 (ahead of round 2) and round 4 (ahead of round 3: the learner had let its
        # first version run 3 rounds, so a round ahead of round 3 was a fair bet)
        assert run.rounds_ahead_dropped == 2
        summary = collector.summary()
    for r in range(total // 2):
        a, b = handles[2 * r: 2 * r + 2]
        assert a.weights_version == b.weights_version == asked[2 * r], (r, a, b)
    ids = [h.batch_id for h in handles]
    assert len(set(ids)) == total and ids == sorted(ids)
    assert sum(h.frames for h in handles) == 20 * total  # taken-back frames collected again
    assert [h.weights_version for h in handles] == [0] * 6 + [1] * 2 + [2] * 4 + [3] * 4
    # The rounds taken back are dropped like stale batches: committed, counted, not handed over.
    assert summary["dropped_stale"] == 4 and summary["frames"] == 20 * total
    store = daskrl.open_store(str(tmp_path / "s"))
    assert len(store) == total + 4 and set(ids) < set(store.records())
    check_episode_continuity(store)


def test_a_learner_that_publishes_every_third_round_loses_one_round_ahead_only(client, tmp_path):
    """After its first publish the collector knows the learner's period: rounds ahead are
    submitted within a version's rounds, never across the publish."""
    policy = TagPolicy()
    rounds, period = 12, 3
    with _collector(client, tmp_path / "s", 2 * rounds, policy) as collector:
        run = collector._running()
        ahead = []
        for i, handle in enumerate(collector):
            r = i // 2
            assert handle.weights_version == r // period, (i, handle)
            tags = handle.load(keys=["tag"])["tag"]
            assert (tags == handle.weights_version).all(), (handle, tags)
            if i % 2 == 0:
                ahead.append(bool(run._ahead))  # a round ahead of this one is in flight
            if i % 2 == 1 and r % period == period - 1:
                with torch.no_grad():
                    policy.tag.fill_(collector.weights_version + 1)
                collector.update_weights(policy)
        # The first version's third round was ahead of the first publish; never after it.
        assert run.rounds_ahead_dropped == 1
        # Ahead: rounds 1 and 2 of the first version, then the first two of every version.
        assert ahead == [False, True, True] + [True, True, False] * (rounds // period - 1)
        assert collector.summary()["dropped_stale"] == 2
    check_episode_continuity(daskrl.open_store(str(tmp_path / "s")))
