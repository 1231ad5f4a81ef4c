"""Several envs in one collection, without Dask: specs and their checks, streams, the plan's
env indices, run settings, commit records and the readers' env selection."""

from __future__ import annotations

import functools
import re

import gymnasium as gym
import pytest

from daskrl import ConfigError, EnvSpacesMismatchError, StoreFormatError, UsageError
from daskrl.collect._env_list import env_labels, env_specs, probe_envs, stream_count
from daskrl.collect._planner import Planner
from daskrl.collect._resume import ResumeMismatchError, check_settings, run_settings
from daskrl.config import CollectorConfig
from daskrl.store._env_select import env_label, env_matcher
from daskrl.store._handles import BatchHandle
from daskrl.store._records import check_commit_record
from daskrl.testing import CountingEnv

SHORT = functools.partial(CountingEnv, length=3)


def test_specs_carry_the_configs_env_settings_and_wrappers():
    cfg = CollectorConfig(max_frames_per_traj=9, env_kwargs={"length": 4},
                          wrappers=["gymnasium.wrappers.RecordEpisodeStatistics"])
    specs = env_specs(["daskrl.testing:Counting-v0", "daskrl.testing:CountingEnv"], cfg)
    assert [s.env for s in specs] == ["daskrl.testing:Counting-v0", "daskrl.testing:CountingEnv"]
    assert all(s.max_episode_steps == 9 and dict(s.env_kwargs) == {"length": 4}
               and [w.path for w in s.wrappers] == ["gymnasium.wrappers.RecordEpisodeStatistics"]
               for s in specs)
    assert env_labels(specs) == ["daskrl.testing:Counting-v0", "daskrl.testing:CountingEnv"]
    [one] = env_specs("CartPole-v1", CollectorConfig())
    assert one.env == "CartPole-v1"
    assert len(env_specs(("CartPole-v1",), CollectorConfig())) == 1


def test_bad_lists_are_refused_before_anything_is_made():
    with pytest.raises(ConfigError, match="env is an empty list"):
        env_specs([], CollectorConfig())
    with pytest.raises(ConfigError, match=re.escape(
            "num_workers=3 is not a multiple of the 2 envs: stream s collects env s % 2, so "
            "each env gets the same number of streams. Use num_workers=2 or 4 (--workers)")):
        env_specs(["CartPole-v1", SHORT], CollectorConfig(num_workers=3))
    env_specs(["CartPole-v1", SHORT], CollectorConfig(num_workers=4))  # a multiple is fine
    with pytest.raises(ConfigError, match=re.escape(
            "env 1 of the list: env must be a gymnasium id (str) or a zero-argument factory "
            "returning a gymnasium.Env, got list: ['CartPole-v1'].")):
        env_specs(["CartPole-v1", ["CartPole-v1"]], CollectorConfig())
    env_specs("CartPole-v1", CollectorConfig(num_workers=3))  # one env: any number


def test_spaces_must_agree_and_the_error_names_both_envs():
    specs = env_specs([SHORT, "daskrl.testing:Counting-v0"], CollectorConfig())
    assert probe_envs(specs) == (CountingEnv().observation_space, gym.spaces.Discrete(2))
    specs = env_specs(["CartPole-v1", "CartPole-v1", "Pendulum-v1"], CollectorConfig())
    with pytest.raises(EnvSpacesMismatchError, match=re.escape(
            "the envs of this collection must have the same spaces, but env 0 ('CartPole-v1') "
            "has the observation space Box([-4.8")) as info:
        probe_envs(specs)
    assert "and env 2 ('Pendulum-v1') has Box([-1. -1. -8.]" in str(info.value)
    assert issubclass(EnvSpacesMismatchError, ConfigError)
    # Same observations, other actions: named too (the factory by its qualified name).
    specs = env_specs([CountingEnv, functools.partial(gym.make, "CartPole-v1")],
                      CollectorConfig(wrappers=["gymnasium.wrappers.FlattenObservation"]))
    with pytest.raises(EnvSpacesMismatchError, match=re.escape(
            "env 0 (factory daskrl.testing.CountingEnv) has the observation space")):
        probe_envs(specs)


def test_streams_are_a_multiple_of_the_envs_and_each_plan_names_its_env():
    assert stream_count(None, 5) == 5 and stream_count(None, 5, 2) == 4
    assert stream_count(None, 1, 3) == 3 and stream_count(6, 1, 3) == 6
    cfg = CollectorConfig(envs_per_worker=2, frames_per_batch=10, total_frames=60)
    p = Planner(cfg, 0, num_streams=4, num_envs=2)
    plans = list(iter(p.next, None))
    assert [(b.stream, b.env) for b in plans] == [(0, 0), (1, 1), (2, 0), (3, 1), (0, 0),
                                                  (1, 1)]
    assert [b.env for b in Planner(cfg, 0, 3).round()] == [0, 0, 0]
    with pytest.raises(ConfigError, match="num_streams=3 must be a multiple of num_envs=2"):
        Planner(cfg, 0, num_streams=3, num_envs=2)


def test_run_settings_list_the_envs_and_wrappers_must_agree_to_resume():
    cfg = CollectorConfig(wrappers=["gymnasium.wrappers.TimeLimit:max_episode_steps=7"])
    one = run_settings("CartPole-v1", "obs", "act", cfg)
    assert one["env"] == "CartPole-v1" and one["envs"] == ["CartPole-v1"]
    assert one["wrappers"] == ["gymnasium.wrappers.TimeLimit:max_episode_steps=7"]
    two = run_settings(["CartPole-v1", "a.make"], "obs", "act", cfg)
    assert two["env"] == two["envs"] == ["CartPole-v1", "a.make"]
    other = run_settings("CartPole-v1", "obs", "act", CollectorConfig())
    with pytest.raises(ResumeMismatchError, match=re.escape(
            "wrappers differs (run 0: ['gymnasium.wrappers.TimeLimit:max_episode_steps=7'], "
            "this collector: [])")):
        check_settings(0, one, other, "file:///s")
    with pytest.raises(ResumeMismatchError, match="env differs"):
        check_settings(0, one, two, "file:///s")


def _record(batch_id: int, **extra):
    h = BatchHandle("file:///s", batch_id, 4, 0, 0, "w", "cpu", (), (),
                    f"batches/{batch_id:012d}-abc.zip", **extra)
    return {**h.record(), "stream": 0}


def test_the_env_index_is_in_commit_records_and_checked():
    rec = _record(7, env=2)
    assert rec["env"] == 2
    assert BatchHandle.from_record("file:///s", rec).env == 2
    doc = {"zarr_format": 3, "node_type": "group", "attributes": rec}
    assert check_commit_record(doc, 7, "here")["env"] == 2
    old = {k: v for k, v in rec.items() if k != "env"}  # a record written before `env`
    assert BatchHandle.from_record("file:///s", old).env == 0
    for bad in (-1, "0", True, 1.0):
        doc["attributes"] = {**rec, "env": bad}
        with pytest.raises(StoreFormatError, match=re.escape("field(s) ['env']")):
            check_commit_record(doc, 7, "here")


def test_batches_are_selected_by_env_index_or_label():
    runs = {0: {"settings": {"env": ["CartPole-v1", "a.make"], "envs": ["CartPole-v1", "a.make"]}},
            1: {"settings": {"env": "a.make"}}}  # a record from before `envs` was added
    recs = [_record(0, env=0), _record(1, env=1), _record(1_000_000_000)]
    asked = []

    def pick(selector):
        match = env_matcher(selector, lambda: asked.append(1) or runs)
        return [r["batch_id"] for r in recs if match(r)]

    assert env_matcher(None, lambda: runs) is None
    assert pick(0) == [0, 1_000_000_000] and pick(1) == [1] and not asked  # indices: no runs read
    assert pick("a.make") == [1, 1_000_000_000] and asked
    assert pick("CartPole-v1") == [0] and pick(["CartPole-v1", 1]) == [0, 1]
    assert pick({"nope"}) == [] and pick(range(2)) == [0, 1, 1_000_000_000]
    assert env_label(runs[0]["settings"], 1) == "a.make"
    assert env_label(runs[1]["settings"], 0) == "a.make" and env_label({}, 0) is None
    for bad in (True, -1, 1.5, [None]):
        with pytest.raises(UsageError, match=re.escape(
                "env= selects by env index (an int >= 0) or env label (a str)")):
            env_matcher(bad, lambda: runs)
