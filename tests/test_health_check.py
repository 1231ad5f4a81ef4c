"""The learner's health check while it waits: a small membership poll, full identity rarely."""

from __future__ import annotations

import functools

import daskrl
from daskrl.testing import SlowEnv, TagPolicy, check_episode_continuity


def _count_calls(scheduler, ops: tuple[str, ...]) -> dict[str, int]:
    """Count the scheduler's RPCs ``ops`` (wrapping its handlers, as bench_scale does)."""
    counts = dict.fromkeys(ops, 0)
    for op in ops:
        handler = scheduler.handlers[op]

        @functools.wraps(handler)
        def counted(*a, _op=op, _h=handler, **k):
            counts[_op] += 1
            return _h(*a, **k)
        scheduler.handlers[op] = counted
    return counts


def test_waiting_learner_polls_membership_and_asks_every_workers_identity_rarely(
        tmp_path, inproc_client):
    # Batches of ~0.8 s each (SlowEnv): the learner waits most of the time. It polls the
    # worker list (ncores) every 0.25 s and asks for every worker's identity only every
    # min(2 s, call_timeout / 8) = 2 s or when the list changes.
    url = str(tmp_path / "s")
    with daskrl.Collector(functools.partial(SlowEnv, 0.1), TagPolicy(), url,
                          client=inproc_client, envs_per_worker=1, frames_per_batch=8,
                          total_frames=8 * 8, num_workers=2, call_timeout=30) as c:
        counts = _count_calls(inproc_client.cluster.scheduler, ("identity", "ncores"))
        handles = list(c)
    assert sorted(h.batch_id for h in handles) == list(range(8))
    check_episode_continuity(daskrl.open_store(url))
    assert counts["ncores"] >= 8  # >= 3 s of waiting at 4 polls/s (>= 0.8 s per round)
    assert counts["identity"] <= counts["ncores"] / 4 + 2
