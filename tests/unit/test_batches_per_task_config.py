"""``batches_per_task``: its validation, its CLI flag, and the plans it makes (no Dask)."""

from __future__ import annotations

import argparse

import pytest

from daskrl.cli._options import add_config_options, config_from_args
from daskrl.collect._planner import Planner
from daskrl.config import CollectorConfig
from daskrl.errors import ConfigError


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "3", None])
def test_batches_per_task_below_one_or_not_an_integer_is_refused(bad):
    with pytest.raises(ConfigError, match=r"batches_per_task must be an integer >= 1, got"):
        CollectorConfig(batches_per_task=bad)


def test_the_flag_comes_from_the_config():
    p = argparse.ArgumentParser(prog="test", exit_on_error=False)
    add_config_options(p)
    assert config_from_args(p.parse_args(["--batches-per-task", "4"])) == CollectorConfig(
        batches_per_task=4)
    with pytest.raises(ConfigError, match="batches_per_task"):
        config_from_args(p.parse_args(["--batches-per-task", "0"]))


def test_rounds_and_tasks_of_k_batches_keep_the_budget_exact():
    cfg = CollectorConfig(envs_per_worker=2, frames_per_batch=10, total_frames=74,
                          batches_per_task=3)
    p = Planner(cfg, first_id=0, num_streams=2)
    first = p.round()  # three batches per stream, in id order, each continuing its stream
    assert [(b.batch_id, b.stream, b.previous_batch_id) for b in first] == [
        (0, 0, None), (1, 1, None), (2, 0, 0), (3, 1, 1), (4, 0, 2), (5, 1, 3)]
    assert [b.frames for b in p.round()] == [10, 4]  # the last round holds what is left
    assert p.round() == []
    q = Planner(cfg, first_id=0, num_streams=2)
    assert [b.batch_id for b in q.task(1)] == [0, 1, 2]
    assert [b.previous_batch_id for b in q.task(1)] == [2, 3, 4]
    assert [(b.frames, b.previous_batch_id) for b in q.task(0)] == [(10, None), (4, 6)]
    assert q.task(0) == []
