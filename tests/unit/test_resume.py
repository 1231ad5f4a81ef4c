"""Resuming, without Dask: which run ``resume=`` names, the settings that must agree, the
frames already committed, the top-up plan, the ``--resume`` flag and the run record's
``resumes`` field, on real stores written on disk."""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from pathlib import Path

import gymnasium as gym
import pytest

from daskrl.cli._options import add_config_options, config_from_args
from daskrl.collect._planner import Planner
from daskrl.collect._resume import MUST_AGREE, Resume, plan_resume, run_settings
from daskrl.config import CollectorConfig
from daskrl.errors import ConfigError, ResumeError, ResumeMismatchError, StoreRecordWarning
from daskrl.store._layout import BATCH_IDS_PER_RUN, run_key
from daskrl.store._store import TrajectoryStore

sys.path.insert(0, str(Path(__file__).parent.parent))
from sample_batches import sample_arrays, sample_meta

CFG = CollectorConfig(envs_per_worker=2, frames_per_batch=12, total_frames=50)
ENV = gym.make("CartPole-v1")


def _settings(cfg: CollectorConfig = CFG, env: gym.Env = ENV) -> dict:
    return run_settings("CartPole-v1", env.observation_space, env.action_space, cfg)


def _store(tmp_path: Path) -> TrajectoryStore:
    store = TrajectoryStore(tmp_path / "store", read_only=False)
    store.initialize()
    return store


def _run(store: TrajectoryStore, batches: int, resumes: int | None = None,
         settings: dict | None = None) -> int:
    """A run with ``batches`` committed batches of 12 frames (T=6, E=2)."""
    run = store.register_run(settings or _settings(), resumes=resumes)
    for i in range(batches):
        store.write_batch(run * BATCH_IDS_PER_RUN + i, sample_arrays(), sample_meta())
    return run


def test_the_resume_flag_takes_an_optional_run_number():
    p = argparse.ArgumentParser(exit_on_error=False)
    add_config_options(p)
    assert config_from_args(p.parse_args([])).resume is False
    assert config_from_args(p.parse_args(["--resume"])).resume is True
    assert config_from_args(p.parse_args(["--resume", "3"])).resume == 3
    assert config_from_args(p.parse_args(["--resume", "--seed", "2"])).resume is True
    with pytest.raises(argparse.ArgumentError, match="invalid int value: 'x'"):
        p.parse_args(["--resume", "x"])


@pytest.mark.parametrize("bad", [-1, "0", 1.0, None])
def test_resume_must_be_a_bool_or_a_run_number(bad):
    with pytest.raises(ConfigError, match=re.escape(
            f"resume must be True, False or a run number (an integer >= 0), got {bad!r}.")):
        CollectorConfig(resume=bad)


def test_the_plan_tops_up_to_total_frames_and_counts_random_frames():
    cfg = CollectorConfig(envs_per_worker=2, frames_per_batch=10, total_frames=34,
                          init_random_frames=12)
    p = Planner(cfg, first_id=2 * BATCH_IDS_PER_RUN, num_streams=2, done_frames=10)
    plans = list(iter(p.next, None))
    assert [b.frames for b in plans] == [10, 10, 4]
    assert [b.batch_id - 2 * BATCH_IDS_PER_RUN for b in plans] == [0, 1, 2]
    assert [b.previous_batch_id for b in plans] == [None, None, plans[0].batch_id]
    assert [b.random_steps for b in plans] == [1, 0, 0]  # frames 10, 11 of 12 random ones
    assert list(iter(Planner(cfg, 0, 1, done_frames=34).next, None)) == []
    assert list(iter(Planner(cfg, 0, 1, done_frames=40).next, None)) == []


def test_no_resume_and_a_store_without_runs_start_a_new_collection(tmp_path, caplog):
    store = _store(tmp_path)
    assert plan_resume(store, False, _settings()) is None
    with caplog.at_level(logging.WARNING, logger="daskrl.collect._resume"):
        assert plan_resume(store, True, _settings()) is None
    assert "holds no run to resume: starting a new collection" in caplog.text
    with pytest.raises(ResumeError, match=re.escape(
            f"cannot resume run 0 of store {store.url!r}: the store has no run 0 (its runs: "
            "none). resume=True continues the latest run.")):
        plan_resume(store, 0, _settings())


def test_the_latest_run_is_resumed_with_its_chains_frames(tmp_path):
    store = _store(tmp_path)
    _run(store, 2)          # run 0, another collection
    _run(store, 3)          # run 1: 36 frames
    _run(store, 1, resumes=1)  # run 2 resumed it: 12 more
    assert store.runs()[2]["resumes"] == 1 and "resumes" not in store.runs()[1]
    assert plan_resume(store, True, _settings()) == Resume(2, (1, 2), 48, 50)
    assert plan_resume(store, 0, _settings()) == Resume(0, (0,), 24, 50)
    plan = plan_resume(store, True, _settings())
    assert plan is not None and plan.frames_left == 2 and not plan.complete
    with pytest.raises(ResumeError, match=re.escape(
            "cannot resume run 1 of store") + ".*" + re.escape(
            "run 2 resumed it already, and resuming it again would collect its missing frames "
            "twice. Resume the newest run of that collection instead (resume=True resumes run "
            "2).")):
        plan_resume(store, 1, _settings())
    with pytest.raises(ResumeError, match="the store has no run 7 \\(its runs: 0, 1, 2\\)"):
        plan_resume(store, 7, _settings())


def test_a_complete_run_leaves_nothing_and_no_limit_leaves_no_end(tmp_path):
    store = _store(tmp_path)
    _run(store, 5)  # 60 frames >= 50
    plan = plan_resume(store, True, _settings())
    assert plan is not None and plan.complete and plan.frames_left == 0
    endless = CollectorConfig(envs_per_worker=2, frames_per_batch=12, total_frames=None)
    store2 = _store(tmp_path / "2")
    _run(store2, 1, settings=_settings(endless))
    plan = plan_resume(store2, True, _settings(endless))
    assert plan == Resume(0, (0,), 12, None) and plan.frames_left is None and not plan.complete


@pytest.mark.parametrize(("change", "field", "stored", "given"), [
    ({"frames_per_batch": 24}, "frames_per_batch", 12, 24),
    ({"envs_per_worker": 4, "frames_per_batch": 12, "total_frames": 52}, "envs_per_worker", 2, 4),
    ({"total_frames": 100}, "total_frames", 50, 100),
    ({"seed": 1}, "seed", 0, 1),
    ({"reset_at_each_iter": True}, "reset_at_each_iter", False, True),
    ({"max_frames_per_traj": 9}, "max_frames_per_traj", None, 9),
    ({"init_random_frames": 10}, "init_random_frames", 0, 10),
])
def test_a_setting_that_shapes_the_data_must_agree(tmp_path, change, field, stored, given):
    store = _store(tmp_path)
    _run(store, 1)
    cfg = CollectorConfig(**{**{"envs_per_worker": 2, "frames_per_batch": 12,
                                "total_frames": 50}, **change})
    with pytest.raises(ResumeMismatchError, match=re.escape(
            f"cannot resume run 0 of store {store.url!r}: {field} differs (run 0: {stored!r}, "
            f"this collector: {given!r}). A resumed collection continues the run's data with "
            f"the run's settings: pass {field}={stored!r}, or collect into a new store "
            "(store.runs()[0]['settings'] lists the run's settings).")) as err:
        plan_resume(store, True, _settings(cfg))
    assert err.value.field == field and isinstance(err.value, ValueError)


def test_the_env_and_its_spaces_must_agree_other_settings_may_change(tmp_path):
    store = _store(tmp_path)
    _run(store, 1)
    acrobot = gym.make("Acrobot-v1")
    other = run_settings("Acrobot-v1", acrobot.observation_space, acrobot.action_space, CFG)
    with pytest.raises(ResumeMismatchError, match=re.escape(
            "env differs (run 0: 'CartPole-v1', this collector: 'Acrobot-v1')") + ".*"
            + re.escape("resume it with the run's env (and env_kwargs)")) as err:
        plan_resume(store, True, other)
    assert err.value.field == "env"
    spaces = {**_settings(), "action_space": repr(gym.spaces.Discrete(3))}
    with pytest.raises(ResumeMismatchError, match=re.escape(
            "action_space differs (run 0: 'Discrete(2)', this collector: 'Discrete(3)')")):
        plan_resume(store, True, spaces)
    free = CollectorConfig(envs_per_worker=2, frames_per_batch=12, total_frames=50,
                           num_workers=5, rounds=False, compression="lz4", batch_timeout=3.0,
                           max_policy_lag=1, on_env_error="restart")
    assert plan_resume(store, True, _settings(free)) == Resume(0, (0,), 12, 50)
    assert set(MUST_AGREE) <= set(_settings())
    assert "resume" not in _settings(CollectorConfig(resume=True))


def test_a_record_from_before_spaces_were_stored_is_checked_on_what_it_has(tmp_path):
    store = _store(tmp_path)
    old = {k: v for k, v in _settings().items() if not k.endswith("_space")}
    _run(store, 2, settings=old)
    assert plan_resume(store, True, _settings()) == Resume(0, (0,), 24, 50)


def test_a_record_that_stores_sync_resumes_with_rounds(tmp_path):
    # run records written when the option was named sync: {"sync": False, ...}
    store = _store(tmp_path)
    stored = {("sync" if k == "rounds" else k): v for k, v in _settings().items()}
    assert "sync" in stored and "rounds" not in stored
    _run(store, 2, settings=stored)
    first_done = CollectorConfig(envs_per_worker=2, frames_per_batch=12, total_frames=50,
                                 rounds=False)
    assert plan_resume(store, True, _settings(first_done)) == Resume(0, (0,), 24, 50)
    assert "rounds" in _settings() and "sync" not in _settings()


def test_an_unreadable_run_record_is_not_resumed_around(tmp_path):
    store = _store(tmp_path)
    _run(store, 1)
    _run(store, 1, resumes=0)
    (Path(store.url.removeprefix("file://")) / run_key(1)).write_text("{not json")
    with pytest.warns(StoreRecordWarning), pytest.raises(ResumeError, match=re.escape(
            "cannot resume run 1 of store") + ".*its run record cannot be read"):
        plan_resume(store, True, _settings())
    # a run continuing an unreadable one: its chain's frames are not known
    store2 = _store(tmp_path / "2")
    _run(store2, 1)
    _run(store2, 1, resumes=0)
    (Path(store2.url.removeprefix("file://")) / run_key(0)).write_text("[]")
    with pytest.warns(StoreRecordWarning), pytest.raises(ResumeError, match=re.escape(
            "it continues run 0, whose run record cannot be read")):
        plan_resume(store2, 1, _settings())


@pytest.mark.parametrize("bad", [-1, 1, 5, "0", True, 0.0])
def test_a_run_record_whose_resumes_is_not_an_earlier_run_is_skipped(tmp_path, bad):
    store = _store(tmp_path)
    _run(store, 1)
    run = _run(store, 1)
    key = Path(store.url.removeprefix("file://")) / run_key(run)
    doc = json.loads(key.read_text())
    doc["attributes"]["resumes"] = bad
    key.write_text(json.dumps(doc))
    with pytest.warns(StoreRecordWarning, match=re.escape("field(s) ['resumes'] have the wrong "
                                                          "type or value")):
        assert list(TrajectoryStore(store.url).runs()) == [0]
