"""Option names: a removed option and a misspelt one are refused with what to do, a renamed
one still works with a warning (no Dask)."""

from __future__ import annotations

import argparse
import dataclasses
import re

import pytest

import daskrl
from daskrl.cli._options import add_config_options
from daskrl.collect._planner import Planner
from daskrl.config import REMOVED_OPTIONS, CollectorConfig, check_option_names
from daskrl.errors import ConfigError
from daskrl.testing import TagPolicy

UNKNOWN = ("'n_workers' is not a {} option. Did you mean 'num_workers'? The options are "
           "CollectorConfig's fields (docs/collecting.md).")


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


def test_an_unknown_config_keyword_names_the_option_it_may_mean():
    with pytest.raises(ConfigError, match=re.escape(UNKNOWN.format("CollectorConfig"))):
        CollectorConfig(n_workers=2)
    with pytest.raises(ConfigError, match=r"'zzz' is not a CollectorConfig option\. The"):
        CollectorConfig(frames_per_batch=8, zzz=1)
    with pytest.raises(ConfigError, match="batches_per_task is no longer an option"):
        dataclasses.replace(CollectorConfig(), batches_per_task=2)


def test_an_unknown_collector_keyword_names_the_option_it_may_mean():
    # refused on the learner, before any env, store or cluster is made
    with pytest.raises(ConfigError, match=re.escape(UNKNOWN.format("Collector"))):
        daskrl.Collector("no-such-env", TagPolicy(), "memory://unused", n_workers=2)


def test_sync_is_a_deprecated_name_of_rounds():
    with pytest.warns(DeprecationWarning, match=re.escape(
            "the option sync= is deprecated: use rounds= (same meaning).")) as caught:
        cfg = CollectorConfig(sync=False)
    assert cfg.rounds is False and cfg == CollectorConfig(rounds=False)
    assert caught[0].filename == __file__  # the warning points at the caller's line
    assert "sync" not in {f.name for f in dataclasses.fields(CollectorConfig)}
    assert "sync" not in cfg.as_dict() and cfg.as_dict()["rounds"] is False
    with pytest.warns(DeprecationWarning, match=re.escape(
            "CollectorConfig.sync is deprecated: use CollectorConfig.rounds (same value).")):
        assert cfg.sync is False
    with pytest.raises(ConfigError, match=re.escape(
            "sync= and rounds= are the same option: give rounds= only.")):
        CollectorConfig(sync=False, rounds=False)


def test_a_collector_takes_sync_with_a_warning_that_points_at_the_caller():
    # the warning comes first; the bad frames_per_batch then stops it before any cluster
    with pytest.warns(DeprecationWarning, match=re.escape("use rounds=")) as caught, \
            pytest.raises(ConfigError, match="frames_per_batch=7 is not a multiple"):
        daskrl.Collector("CartPole-v1", TagPolicy(), "memory://unused",
                         config=CollectorConfig(rounds=True), sync=False, frames_per_batch=7)
    assert caught[0].filename == __file__


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
