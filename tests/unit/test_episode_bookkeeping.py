"""The episode bookkeeping every rollout loop shares, without envs or Dask."""

from __future__ import annotations

import re

import numpy as np
import pytest

from daskrl import EnvError
from daskrl.store._layout import EPISODE_ID_STRIDE, MAX_RUNS, episode_id_base, run_first_batch
from daskrl.worker._episodes import ENDLESS_ADVICE, Episodes, episode_columns

S = EPISODE_ID_STRIDE


def _batch(episodes: Episodes, batch_id: int, steps: int, ends: dict[int, list[int]],
           reward: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """One aligned batch: every env earns ``reward`` a step; ``ends[t]`` end at row ``t``."""
    episodes.begin(batch_id)
    for t in range(steps):
        episodes.ret += reward
        if t in ends:
            episodes.end(t, ends[t])
    return episodes.finish(steps)


def test_restart_starts_every_env_at_row_zero_of_the_batch():
    episodes = Episodes(3)
    episodes.ret[:] = 5.0
    episodes.step[:] = 7
    episodes.restart(4)
    assert episodes.id.tolist() == [4 * S, 4 * S + 1, 4 * S + 2]
    assert episodes.step.tolist() == [0, 0, 0]
    assert episodes.ret.tolist() == [0.0, 0.0, 0.0]


def test_ids_steps_returns_and_lengths_within_and_across_batches():
    E = 2
    episodes = Episodes(E)
    episodes.restart(0)
    ids, step = _batch(episodes, 0, 4, {1: [0], 3: [1]})
    # env 0 ended at row 1 (2 steps) and began again at row 2: id 0 * S + 2 * E + 0
    assert ids[:, 0].tolist() == [0, 0, 2 * E, 2 * E]
    assert step[:, 0].tolist() == [0, 1, 0, 1]
    # env 1 ended on the batch's last row: its next episode starts in the next batch, with
    # the id of this batch's row 4
    assert ids[:, 1].tolist() == [1, 1, 1, 1]
    assert step[:, 1].tolist() == [0, 1, 2, 3]
    assert episodes.returns == [2.0, 4.0] and episodes.lengths == [2, 4]
    assert episodes.id.tolist() == [2 * E, 4 * E + 1]
    assert episodes.step.tolist() == [2, 0]
    assert episodes.ret.tolist() == [2.0, 0.0]

    ids, step = _batch(episodes, 1, 3, {0: [0]}, reward=0.5)
    assert ids[:, 0].tolist() == [2 * E, S + E, S + E]
    assert step[:, 0].tolist() == [2, 0, 1]
    assert ids[:, 1].tolist() == [4 * E + 1] * 3
    assert step[:, 1].tolist() == [0, 1, 2]
    assert episodes.returns == [2.5] and episodes.lengths == [3]  # this batch's alone


def test_ids_of_runs_past_the_first_550_follow_the_store_layout():
    episodes = Episodes(2)
    batch_id = run_first_batch(MAX_RUNS - 1) + 3
    base = episode_id_base(batch_id)
    assert base < 0  # the extended packing
    episodes.restart(batch_id)
    ids, _ = _batch(episodes, batch_id, 3, {0: [1]})
    assert ids.tolist() == [[base, base + 1], [base, base + 2 + 1], [base, base + 2 + 1]]


def test_loops_that_keep_their_own_steps_report_ended_episodes():
    episodes = Episodes(2)
    episodes.begin(0)
    episodes.ended(3.5, 7)
    episodes.ended(1.0, 2)
    assert episodes.returns == [3.5, 1.0] and episodes.lengths == [7, 2]
    episodes.begin(1)
    assert episodes.returns == [] and episodes.lengths == []


def test_an_endless_episode_is_named_with_the_one_advice():
    episodes = Episodes(3)
    episodes.step[:] = [4, 9, 2]
    episodes.check_endless("env 'X'", 10)  # below the limit
    episodes.step[1] = 10
    message = ("env env 'X' (env index 1) has run an episode of 10 steps without terminating "
               f"or truncating. {ENDLESS_ADVICE}")
    with pytest.raises(EnvError, match=re.escape(message)):
        episodes.check_endless("env 'X'", 10)
    assert "max_frames_per_traj" in ENDLESS_ADVICE and "TimeLimit" in ENDLESS_ADVICE


def test_columns_match_a_row_by_row_count():
    rng = np.random.default_rng(0)
    steps, E, base = 30, 5, 9 * S
    carried_ids = rng.integers(0, S, E)
    carried_steps = rng.integers(0, 50, E)
    starts = sorted({(int(r), int(i)) for r, i in zip(rng.integers(1, steps + 1, 20),
                                                      rng.integers(0, E, 20))})
    ids, step = episode_columns(steps, E, base, carried_ids, carried_steps, starts)
    for i in range(E):
        cur_id, cur_step = int(carried_ids[i]), int(carried_steps[i])
        for t in range(steps):
            if (t, i) in starts:
                cur_id, cur_step = base + t * E + i, 0
            assert (ids[t, i], step[t, i]) == (cur_id, cur_step)
            cur_step += 1
