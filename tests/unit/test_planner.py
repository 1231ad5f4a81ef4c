"""The batch plan, without Dask: budget, ids, streams, requeue and stream placement."""

from __future__ import annotations

import pytest

from daskrl.collect._planner import Planner, stream_placement
from daskrl.config import CollectorConfig
from daskrl.errors import ConfigError


def test_budget_is_exact_ids_follow_and_streams_chain():
    cfg = CollectorConfig(envs_per_worker=2, frames_per_batch=10, total_frames=34,
                          init_random_frames=12)
    p = Planner(cfg, first_id=1000, num_streams=2)
    plans = list(iter(p.next, None))
    assert [b.frames for b in plans] == [10, 10, 10, 4]
    assert [b.batch_id for b in plans] == [1000, 1001, 1002, 1003]
    assert [b.stream for b in plans] == [0, 1, 0, 1]
    assert [b.previous_batch_id for b in plans] == [None, None, 1000, 1001]
    assert [b.random_steps for b in plans] == [5, 1, 0, 0]
    assert p.exhausted and p.next() is None


def test_requeued_frames_come_first_and_rounds_use_every_stream():
    cfg = CollectorConfig(envs_per_worker=2, frames_per_batch=10, total_frames=20)
    p = Planner(cfg, first_id=0, num_streams=2)
    assert [b.stream for b in p.round()] == [0, 1]
    assert p.next() is None and p.exhausted
    p.requeue(10)
    assert not p.exhausted
    [again] = p.round()
    assert (again.frames, again.batch_id, again.previous_batch_id) == (10, 2, 0)
    assert p.round() == []
    assert Planner(CollectorConfig(batches_in_flight=2), 0, 3).initial_streams() == [
        0, 1, 2, 0, 1, 2]


def test_no_streams_is_refused():
    with pytest.raises(ConfigError, match="num_streams must be >= 1"):
        Planner(CollectorConfig(), 0, 0)


def test_a_stream_moves_off_a_departed_or_overloaded_worker():
    streams = ["a", "a", "b"]
    assert stream_placement(streams, 0, {"a", "b"}) == "a"  # a has 1 other, b has 1
    assert stream_placement(streams, 2, {"a", "c"}) == "c"  # b left: to the idlest
    streams = ["a", "a", "a"]
    assert stream_placement(streams, 1, {"a", "b"}) == "b"  # a replacement joined
    assert stream_placement(["x"], 0, set()) == "x"  # no worker: stays


def _placement_by_definition(streams, stream, live):
    """The rule as stated: count the other streams per live worker, move to the least loaded
    (by name on ties) if the worker left or has more than that one."""
    current = streams[stream]
    if not live:
        return current
    load = dict.fromkeys(live, 0)
    for s, w in enumerate(streams):
        if w in load and s != stream:
            load[w] += 1
    idle = min(live, key=lambda w: (load[w], w))
    if current not in live or load[current] > load[idle]:
        streams[stream] = idle
    return streams[stream]


def test_placement_of_many_streams_in_a_row_follows_the_rule():
    # Placement counts once and keeps the counts as streams move: the same answers as the
    # rule applied stream by stream to the updated list.
    import random

    from daskrl.collect._planner import Placement

    rng = random.Random(0)
    for _ in range(500):
        workers = [f"w{i}" for i in range(rng.randint(1, 6))]
        streams = [rng.choice([*workers, "gone"]) for _ in range(rng.randint(1, 12))]
        live = set(rng.sample(workers, rng.randint(0, len(workers))))
        by_definition, together = list(streams), list(streams)
        placement = Placement(together, live)
        for s in range(len(streams)):
            assert placement.worker(s) == _placement_by_definition(by_definition, s, live)
        assert together == by_definition


def _rounds_ahead(period: int | None, rounds: int = 24) -> tuple[int, int]:
    """A learner that publishes after every ``period``-th round (None: never): how many
    rounds given ahead were used, and how many taken back (the learner had published)."""
    from daskrl.collect._planner import RoundsAhead

    rule, version, end_version, given_on = RoundsAhead(), 0, None, None
    used = taken_back = 0
    for r in range(1, rounds + 1):
        if given_on is not None:
            used, taken_back = (used + 1, taken_back) if given_on == version else (
                used, taken_back + 1)
        given_on = version if rule.start_round(version, end_version) else None
        end_version = version  # the round's last batch is taken, then maybe a publish
        if period is not None and r % period == 0:
            version += 1
    return used, taken_back


@pytest.mark.parametrize("period", [None, 1, 2, 3, 5])
def test_rounds_ahead_pay_off_and_cost_one_round_in_all(period):
    used, taken_back = _rounds_ahead(period, rounds=24)
    if period is None:  # never publishes: every round after the first two came ahead
        assert (used, taken_back) == (22, 0)
        return
    if period == 1:  # publishes after every round: never given one, so never loses one
        assert (used, taken_back) == (0, 0)
        return
    # One taken back, at the first publish (the period was not known yet). Before it, the
    # rounds after the first two came ahead; after it, all but each version's first.
    assert taken_back == 1
    runs = [min(period, 24 - start) for start in range(0, 24, period)]
    assert used == (runs[0] - 2) + sum(n - 1 for n in runs[1:])
