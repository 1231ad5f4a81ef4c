"""Run numbers, batch ids and episode ids (``store/_layout.py``): runs 0 to 549 keep the ids
of format 2.2, later runs up to :data:`MAX_RUNS` get ids no earlier run can hold, and every
rollout loop numbers its episodes the same way under both packings."""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest
import torch

from daskrl import StoreError
from daskrl.collect._planner import Planner
from daskrl.config import MAX_FRAMES_PER_BATCH, CollectorConfig
from daskrl.store import TrajectoryStore
from daskrl.store._layout import (
    BATCH_IDS_PER_RUN,
    EXTENDED_FIRST_RUN,
    EXTENDED_INDEX_BITS,
    MAX_RUNS,
    UNUSED_EPISODE_IDS,
    batches_per_run,
    episode_id_base,
    episode_origin,
    run_first_batch,
    run_key,
    run_of,
)
from daskrl.testing import CountingEnv, CountingVectorEnv, TagPolicy
from daskrl.worker._envs import EnvSpec
from daskrl.worker._rollout import EnvSet

CPU = torch.device("cpu")
EDGE_RUNS = (0, 1, 548, 549, 550, 551, 65_535, MAX_RUNS - 2, MAX_RUNS - 1)


def test_a_store_numbers_at_least_65536_runs():
    assert MAX_RUNS == 66_086 >= 65_536
    assert EXTENDED_FIRST_RUN == 550


@pytest.mark.parametrize("run", EDGE_RUNS)
def test_each_run_numbers_its_own_batch_ids(run):
    first, n = run_first_batch(run), batches_per_run(run)
    assert run_of(first) == run_of(first + n - 1) == run
    assert run_of(first - 1) == run - 1 if run else first == 0
    assert run_first_batch(run + 1) >= first + n  # the next run's ids come after
    assert len(f"{first + n - 1:012d}") == 12  # commit and container names keep 12 digits
    if run < EXTENDED_FIRST_RUN:  # format 2.2's numbering, unchanged
        assert first == run * BATCH_IDS_PER_RUN


@pytest.mark.parametrize("run", EDGE_RUNS)
def test_episode_ids_fit_int64_and_name_their_batch(run):
    first, n = run_first_batch(run), batches_per_run(run)
    k_max = 2 * MAX_FRAMES_PER_BATCH - 1  # s * E + e <= T * E + E - 1, T * E < 2**24
    for batch_id in (first, first + 1, first + n - 1):
        for k in (0, 1, k_max if run >= EXTENDED_FIRST_RUN else (1 << 24) - 1):
            episode_id = episode_id_base(batch_id) + k
            assert np.int64(episode_id) == episode_id  # fits int64
            assert episode_origin(episode_id) == (batch_id, k)
            assert episode_id not in UNUSED_EPISODE_IDS
            assert (episode_id >= 0) == (run < EXTENDED_FIRST_RUN)
            if run < EXTENDED_FIRST_RUN:  # format 2.2's episode ids, unchanged
                assert episode_id == batch_id * 2**24 + k


def test_extended_ids_follow_each_other_without_overlap():
    """Consecutive extended batches' id ranges touch and never overlap."""
    for batch_id in (run_first_batch(550), run_first_batch(551) - 1, run_first_batch(60_000)):
        assert episode_id_base(batch_id + 1) - episode_id_base(batch_id) == 1 << EXTENDED_INDEX_BITS
    last = run_first_batch(MAX_RUNS - 1) + batches_per_run(MAX_RUNS - 1) - 1
    assert episode_id_base(last) + (1 << EXTENDED_INDEX_BITS) - 1 < UNUSED_EPISODE_IDS.start


def test_a_run_past_its_batch_ids_is_stopped_before_a_worker_runs():
    run = MAX_RUNS - 1
    cfg = CollectorConfig(envs_per_worker=2, frames_per_batch=4, total_frames=None)
    planner = Planner(cfg, first_id=run_first_batch(run), num_streams=1)
    planner._next_index = batches_per_run(run) - 1
    assert run_of(planner.next().batch_id) == run
    with pytest.raises(StoreError, match=re.escape(
            f"run {run} has numbered all the 2_097_152 batch ids a run can have")):
        planner.next()


def test_the_store_refuses_a_run_past_the_last(tmp_path):
    store = TrajectoryStore(str(tmp_path / "s"), read_only=False)
    store.initialize()
    store._writer.docs.put(run_key(MAX_RUNS - 2), {"zarr_format": 3, "node_type": "group",
                                                   "attributes": {"run": MAX_RUNS - 2}})
    assert store.register_run({}) == MAX_RUNS - 1
    with pytest.raises(StoreError, match=re.escape(
            "has used all 66_086 run numbers a store can have (its newest run is 66085")):
        store.register_run({})


def _single() -> EnvSet:
    return EnvSet(EnvSpec(lambda: CountingEnv(3)), n_envs=3, seed=0, stream=0)


def _aligned() -> EnvSet:
    envset = EnvSet(EnvSpec(functools.partial(CountingVectorEnv, 3, 3, "SameStep"),
                            num_envs=3), 3, seed=0, stream=0)
    assert not envset.staggered
    return envset


def _staggered() -> EnvSet:
    envset = EnvSet(EnvSpec(functools.partial(CountingVectorEnv, 3, 1, "NextStep"),
                            num_envs=3), 3, seed=0, stream=0)
    assert envset.staggered  # ids of episodes not yet stored are carried as placeholders
    return envset


@pytest.mark.parametrize("make", [_single, _aligned, _staggered])
def test_every_rollout_numbers_episodes_alike_in_both_packings(make):
    """The same rollout in run 0 and in the last run: ids differ only by where their batch
    is numbered, and an extended run's ids are never taken for placeholders."""
    steps = [4, 4, 1, 1, 4, 5]
    got = {}
    for run in (0, MAX_RUNS - 1):
        envset, first = make(), run_first_batch(run)
        ids = [envset.collect(TagPolicy(), CPU, steps=T, batch_id=first + b)[0]["episode_id"]
               for b, T in enumerate(steps)]
        envset.close()
        got[run] = [[(b - first, k) for b, k in map(episode_origin, a.ravel().tolist())]
                    for a in ids]
        if run:
            assert all((a < UNUSED_EPISODE_IDS.start).all() for a in ids)
    assert got[0] == got[MAX_RUNS - 1]
    assert len({i for batch in got[0] for i in batch}) > len(steps)  # several episodes
