"""Resuming a collection after the learner stopped: a ``daskrl collect`` SIGKILLed part-way and
a ``Collector`` closed early, each continued with ``resume``, on real LocalClusters and real
stores on disk. The store ends with exactly ``total_frames``, every batch id once, episodes
continuous within a run and none across runs, new env streams in the resumed run, and a run
record that names the run it resumes; settings that differ fail before any worker runs."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from cli_cluster import process_group_alive
from distributed import Client

import daskrl
import daskrl.data
from daskrl import Collector, ResumeError, ResumeMismatchError, open_store
from daskrl.collect._resume import Resume
from daskrl.store._layout import run_of
from daskrl.testing import check_episode_continuity

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[1]
TOTAL, FPB, E = 2944, 256, 4  # 11 batches of 256 frames and one of 128
SETTINGS = {"envs_per_worker": E, "frames_per_batch": FPB, "total_frames": TOTAL}


def _first_observations(episodes: list[daskrl.Episode], run: int) -> set[tuple[float, ...]]:
    """The first observation of each of ``run``'s episodes that starts at step 0."""
    return {tuple(ep.data["observation"][0].tolist()) for ep in episodes
            if run_of(ep.batch_ids[0]) == run and int(ep.data["step"][0]) == 0}


def _check_resumed_store(url: str, before: int) -> None:
    """Run 0 stopped with ``before`` frames committed; run 1 resumed it to ``TOTAL``."""
    store = open_store(url)
    runs = store.runs()
    assert sorted(runs) == [0, 1]
    assert runs[1]["resumes"] == 0 and "resumes" not in runs[0]
    assert runs[1]["settings"]["frames_per_batch"] == runs[0]["settings"]["frames_per_batch"]
    records = store.records()
    ids = store.batch_ids()
    assert len(ids) == len(set(ids)) and {run_of(b) for b in ids} == {0, 1}
    assert store.frames == TOTAL  # exactly: the committed frames of run 0 counted
    assert sum(r["frames"] for b, r in records.items() if run_of(b) == 0) == before
    # every batch read once, whole
    read = [h.batch_id for h, batch in store.iter_batches(keys=["reward"])
            if batch["reward"].shape == (h.frames // E, E)]
    assert read == ids
    report = check_episode_continuity(store)  # continuous within each run's streams
    assert report.transitions == TOTAL
    episodes = list(daskrl.data.episodes(store, ["observation", "step"], complete_only=False))
    assert len({ep.episode_id for ep in episodes}) == len(episodes)
    assert all(len({run_of(b) for b in ep.batch_ids}) == 1 for ep in episodes)  # none spans runs
    in_order = [run_of(ep.batch_ids[0]) for ep in episodes]
    assert in_order == sorted(in_order)  # run 0's cut episodes end where run 0's batches do
    last_of_run0 = max(b for b in ids if run_of(b) == 0)
    cut = [ep for ep in episodes if not ep.complete and run_of(ep.batch_ids[-1]) == 0]
    assert cut, "the episodes running when run 0 stopped are cut there"
    for ep in cut:  # the cut episode ends at its stream's last batch of run 0, unflagged
        assert ep.batch_ids[-1] <= last_of_run0 and int(ep.data["step"][-1]) == ep.length - 1
        assert not bool(ep.data["terminated"][-1] | ep.data["truncated"][-1])
    # the resumed run's envs follow new seed streams: no episode starts as one of run 0 did
    first0, first1 = _first_observations(episodes, 0), _first_observations(episodes, 1)
    assert first0 and first1 and not first0 & first1


def test_a_collector_closed_early_is_resumed_to_exactly_total_frames(client, tmp_path,
                                                                     cartpole_policy, caplog):
    url = str(tmp_path / "store")
    with Collector("CartPole-v1", cartpole_policy, url, client=client, num_workers=2,
                   **SETTINGS) as collector:
        handed = []
        for handle in collector:
            handed.append(handle.batch_id)
            if len(handed) == 3:
                break  # the learner stops part-way
    before = open_store(url).frames
    assert 3 * FPB <= before < TOTAL
    # other streams, another compressor and another policy may change; the data's shape not
    with Collector("CartPole-v1", cartpole_policy, url, client=client, resume=True,
                   num_workers=1, compression="lz4", **SETTINGS) as collector:
        assert collector.resumed == Resume(0, (0,), before, TOTAL) and collector.run_number == 1
        handles = []
        for handle in collector:
            handles.append(handle)
            collector.update_weights(cartpole_policy)
    ids = [h.batch_id for h in handles]
    assert len(set(ids)) == len(ids) and {run_of(b) for b in ids} == {1}
    assert sum(h.frames for h in handles) == TOTAL - before
    assert ids == sorted(b for b in open_store(url).batch_ids() if run_of(b) == 1)
    assert handles[-1].frames == (TOTAL - before) % FPB or FPB
    _check_resumed_store(url, before)
    # resumed again, the collection is complete: nothing collected, no run added
    with (caplog.at_level(logging.WARNING, logger="daskrl.collect._startup"),
          Collector("CartPole-v1", cartpole_policy, url, client=client, resume=True,
                    **SETTINGS) as collector):
        assert list(collector) == [] and collector.run_number == -1
        assert collector.resumed == Resume(1, (0, 1), TOTAL, TOTAL)
    assert (f"run 1 of store 'file://{url}' has {TOTAL} frames committed, total_frames={TOTAL}: "
            "nothing is left to collect, and no run is added") in caplog.text
    assert sorted(open_store(url).runs()) == [0, 1] and open_store(url).frames == TOTAL


def test_resume_on_a_store_without_runs_collects_as_a_new_run_would(client, tmp_path,
                                                                    cartpole_policy):
    small = {"envs_per_worker": E, "frames_per_batch": FPB, "total_frames": 2 * FPB,
             "num_workers": 2}
    stores = []
    for name, resume in (("plain", False), ("resumed", True)):
        url = str(tmp_path / name)
        with Collector("CartPole-v1", cartpole_policy, url, client=client, resume=resume,
                       **small) as collector:
            assert collector.resumed is None
            assert sum(h.frames for h in collector) == 2 * FPB
        stores.append(open_store(url))
    plain, resumed = stores
    assert "resumes" not in resumed.runs()[0] and resumed.batch_ids() == plain.batch_ids()
    for bid in plain.batch_ids():  # the same seeds as any new collection
        a, b = plain.load(bid), resumed.load(bid)
        assert all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in ("observation", "action"))


def _plugins(client: Client) -> dict[str, list[str]]:
    return client.run(lambda dask_worker: sorted(dask_worker.plugins))


def test_settings_that_differ_fail_before_any_worker_runs(client, cluster, tmp_path,
                                                          cartpole_policy):
    url = str(tmp_path / "store")
    with Collector("CartPole-v1", cartpole_policy, url, client=client, num_workers=1,
                   **{**SETTINGS, "total_frames": FPB}):
        pass  # a run with nothing committed: stopped before its first batch
    store_dir = tmp_path / "store"
    listing = sorted(p.relative_to(store_dir) for p in store_dir.rglob("*"))
    plugins = _plugins(client)
    # A client whose cluster is gone: a collector that touched the cluster before checking
    # would fail on that instead.
    gone = Client(cluster, set_as_default=False)
    gone.close()
    cases = [
        ({"frames_per_batch": 128}, "frames_per_batch", "frames_per_batch differs (run 0: 256, "
                                                        "this collector: 128)"),
        ({"total_frames": TOTAL}, "total_frames", f"total_frames differs (run 0: {FPB}, this "
                                                  f"collector: {TOTAL})"),
        ({"seed": 3}, "seed", "seed differs (run 0: 0, this collector: 3)"),
        ({"max_frames_per_traj": 50}, "max_frames_per_traj",
         "max_frames_per_traj differs (run 0: None, this collector: 50)"),
    ]
    for change, field, message in cases:
        with pytest.raises(ResumeMismatchError, match=re.escape(message)) as err:
            Collector("CartPole-v1", cartpole_policy, url, client=gone, resume=True,
                      **{**SETTINGS, "total_frames": FPB, **change})
        assert err.value.field == field
    acrobot = _acrobot_policy()
    with pytest.raises(ResumeMismatchError, match=re.escape(
            "env differs (run 0: 'CartPole-v1', this collector: 'Acrobot-v1')")):
        Collector("Acrobot-v1", acrobot, url, client=gone, resume=0,
                  **{**SETTINGS, "total_frames": FPB})
    with pytest.raises(ResumeError, match="the store has no run 4 \\(its runs: 0\\)"):
        Collector("CartPole-v1", cartpole_policy, url, client=gone, resume=4,
                  **{**SETTINGS, "total_frames": FPB})
    # nothing reached a worker, nothing was written
    assert _plugins(client) == plugins
    assert sorted(p.relative_to(store_dir) for p in store_dir.rglob("*")) == listing


def _acrobot_policy():
    import gymnasium as gym

    from daskrl.policies import MLPPolicy

    env = gym.make("Acrobot-v1")
    return MLPPolicy(env.observation_space, env.action_space)


# -- the command line: a learner killed by SIGKILL, then `daskrl collect --resume` -------------

def _cli_env() -> dict[str, str]:
    """This checkout first, and tests/ (for ``resume_policy``) in the children and their
    spawned workers."""
    paths = [str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def _collect_cmd(store: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "daskrl.cli", "collect", "--env", "CartPole-v1", "--store",
            str(store), "--frames", str(TOTAL), "--frames-per-batch", str(FPB),
            "--envs-per-worker", str(E), "--workers", "2", "--no-tls", "--no-progress", *extra]


def test_cli_collect_killed_part_way_is_resumed_with_resume(tmp_path):
    store = tmp_path / "store"
    log = (tmp_path / "first.log").open("w")
    child = subprocess.Popen(_collect_cmd(store, "--policy", "resume_policy:slow_policy"),
                             stdout=log, stderr=subprocess.STDOUT, env=_cli_env(), cwd=tmp_path,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not (store / "commits").is_dir() or len(open_store(str(store))) < 3:
            assert child.poll() is None, (tmp_path / "first.log").read_text()
            assert time.monotonic() < deadline, "the first collection committed no 3 batches"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)  # the learner dies; its cluster's workers follow
        child.wait(timeout=60)
        deadline = time.monotonic() + 60
        while process_group_alive(child.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not process_group_alive(child.pid), "the killed learner's workers outlived it"
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(timeout=60)
        for p in process_group_alive(child.pid):  # never leave a process behind, pass or fail
            p.kill()
        log.close()
    before = open_store(str(store)).frames
    assert 3 * FPB <= before < TOTAL, "the first collection was to be killed part-way"
    # settings that differ: a one-line error naming the field, before any cluster starts
    out = subprocess.run(_collect_cmd(store, "--resume", "--frames-per-batch", "128"),
                         capture_output=True, text=True, timeout=240, env=_cli_env())
    assert out.returncode == 3, out  # a configuration error
    assert out.stderr.startswith("daskrl: error: cannot resume run 0 of store "
                                 f"'file://{store}': frames_per_batch differs (run 0: 256, this "
                                 "collector: 128)"), out.stderr
    # resumed with the default policy (the learner's state is not part of a run)
    out = subprocess.run(_collect_cmd(store, "--resume", "--json"), capture_output=True,
                         text=True, timeout=300, env=_cli_env(), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert (summary["run"], summary["resumes"], summary["resumed_frames"]) == (1, 0, before)
    assert summary["frames"] == TOTAL - before
    assert (f"daskrl: note: resuming run 0 of the store '{store}' as run 1: {before} frames "
            f"committed, collecting {TOTAL - before} more.") in out.stderr
    assert "already holds" not in out.stderr
    _check_resumed_store(str(store), before)
    # once more (on fewer workers): complete, so nothing is collected and no run is added
    out = subprocess.run(_collect_cmd(store, "--resume", "--workers", "1"), capture_output=True,
                         text=True, timeout=300, env=_cli_env(), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "nothing is left to collect, and no run is added" in out.stderr
    assert "collected 0 frames in 0 batches" in out.stdout
    assert f"resumed run 1: {TOTAL} frames were committed before, {TOTAL} in all" in out.stdout
    assert sorted(open_store(str(store)).runs()) == [0, 1]
