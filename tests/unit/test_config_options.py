"""Option names: a removed option and a misspelt one are refused with what to do (no Dask)."""

from __future__ import annotations

import argparse

import pytest

from daskrl.cli._options import add_config_options
from daskrl.collect._planner import Planner
from daskrl.config import REMOVED_OPTIONS, CollectorConfig, check_option_names
from daskrl.errors import ConfigError


def test_batches_per_task_is_refused_with_why_it_is_gone():
    with pytest.raises(ConfigError, match=r"^batches_per_task is no longer an option: each "
                                          r"stream is one long-lived task"):
        check_option_names({"frames_per_batch": 10, "batches_per_task": 4})
    assert set(REMOVED_OPTIONS) == {"batches_per_task"}
    assert "batches_per_task" not in {f for f in CollectorConfig.__dataclass_fields__}


def test_a_misspelt_option_names_the_closest_one():
    with pytest.raises(ConfigError, match=r"'frames_per_bach' is not a Collector option\. Did "
                                          r"you mean 'frames_per_batch'\?"):
        check_option_names({"frames_per_bach": 10})
    with pytest.raises(ConfigError, match=r"'zzz' is not a Collector option\. The options"):
        check_option_names({"zzz": 1})
    check_option_names({f: None for f in CollectorConfig.__dataclass_fields__})  # all known


def test_the_cli_has_no_batches_per_task_flag():
    p = argparse.ArgumentParser(prog="test", exit_on_error=False)
    add_config_options(p)
    with pytest.raises(SystemExit):
        p.parse_args(["--batches-per-task", "4"])


def test_a_sync_round_is_one_batch_per_stream_and_keeps_the_budget_exact():
    cfg = CollectorConfig(envs_per_worker=2, frames_per_batch=10, total_frames=54)
    p = Planner(cfg, first_id=0, num_streams=2)
    first = p.round()  # one batch per stream, in id order
    assert [(b.batch_id, b.stream, b.previous_batch_id) for b in first] == [
        (0, 0, None), (1, 1, None)]
    assert [(b.batch_id, b.stream, b.previous_batch_id) for b in p.round()] == [
        (2, 0, 0), (3, 1, 1)]
    assert [b.frames for b in p.round()] == [10, 4]  # the last round holds what is left
    assert p.round() == []
