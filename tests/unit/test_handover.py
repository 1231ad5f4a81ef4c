"""The hand-over rule and statistics, without Dask (handles from a real store run are not
needed: a handle is a plain record)."""

from __future__ import annotations

import dataclasses
import math
import typing

from daskrl.collect._handover import HandOver
from daskrl.config import RENAMED_OPTIONS, CollectorConfig, CollectorOptions
from daskrl.store._handles import BatchHandle


def _handle(batch_id: int, version: int, frames: int = 10, returns=(1.0,)) -> BatchHandle:
    kwargs = {}
    for f in dataclasses.fields(BatchHandle):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = {"batch_id": batch_id, "weights_version": version, "frames": frames,
                              "worker": "tcp://w:1", "episode_returns": list(returns),
                              "episode_lengths": [5] * len(returns)}.get(f.name, _blank(f))
    return dataclasses.replace(BatchHandle(**kwargs), rollout_seconds=0.5, write_seconds=0.1)


def _blank(f: dataclasses.Field) -> typing.Any:
    t = str(f.type)
    return 0 if "int" in t else 0.0 if "float" in t else "" if "str" in t else None


def test_lag_limit_drops_stale_batches_and_counts_both():
    h = HandOver(max_policy_lag=1)
    assert h.take(_handle(0, 0), newest_version=2) is None  # lag 2 > 1: dropped
    kept = h.take(_handle(1, 1), newest_version=2)
    assert kept is not None and kept.policy_lag == 1
    forced = h.accept(_handle(2, 0), newest_version=3)  # hand_over: the learner decides
    assert forced.policy_lag == 3
    s = h.summary()
    assert (s["batches"], s["frames"], s["dropped_stale"], s["dropped_frames"]) == (2, 20, 1, 10)
    assert s["policy_lag_counts"] == {1: 1, 3: 1} and s["policy_lag_max"] == 3
    assert s["workers"]["tcp://w:1"]["rollout_fps"] == 10 / 0.5
    assert s["episodes"] == 2 and s["mean_return"] == 1.0


def test_no_limit_keeps_everything_and_an_empty_summary_is_nan():
    h = HandOver(max_policy_lag=None)
    assert math.isnan(h.summary()["mean_return"])
    assert h.take(_handle(0, 0), newest_version=100).policy_lag == 100


def test_collector_options_name_every_config_field():
    fields = {f.name for f in dataclasses.fields(CollectorConfig)}
    # and the deprecated names, which type checkers then accept too
    assert set(typing.get_type_hints(CollectorOptions)) == fields | set(RENAMED_OPTIONS)
