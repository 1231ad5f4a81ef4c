"""Metrics sinks on real clusters: what a collector sends to TensorBoard (read back from the
event files with TensorBoard's own reader), W&B (offline, read back from the run's file) and
MLflow (a local file store), checked against the handles and the store's own episodes; the
CLI's ``--tensorboard`` (``daskrl collect`` in this process, on the session's cluster); an
example's ``--tensorboard``."""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import math
import struct
import subprocess
import sys
import threading
from pathlib import Path

import gymnasium as gym
import pytest
import torch
from cli_inprocess import daskrl_main
from distributed import Client
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import daskrl
import daskrl.data
from daskrl import MetricsLoggerWarning
from daskrl.loggers import METRIC_KEYS, MLflowLogger, TensorBoardLogger, WandbLogger, worker_key
from daskrl.policies import MLPPolicy
from daskrl.testing import TagPolicy

ROOT = Path(__file__).resolve().parents[1]
COUNTING = "daskrl.testing:Counting-v0"  # reward t + 1, 5 steps: every episode returns 15
EPISODIC = ("charts/episodic_return", "charts/episodic_length")
pytestmark = pytest.mark.timeout(280)


def scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the event files under ``log_dir``: ``{tag: [(step, value), ...]}``."""
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})  # 0: keep them all
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


class Recorder:
    """A logger holding a lock, so it cannot be pickled: it must never leave the learner."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[int, dict[str, float]]] = []
        self.closed = 0

    def log_metrics(self, metrics, step):
        with self.lock:
            self.calls.append((step, dict(metrics)))

    def close(self):
        self.closed += 1


def _steps(handles) -> list[int]:
    return list(itertools.accumulate(h.frames for h in handles))


def _episodes_of(handles) -> list[tuple[int, float, int]]:
    """``(step, return, length)`` of every episode the handles report, in hand-over order."""
    return [(step, r, n) for step, h in zip(_steps(handles), handles)
            for r, n in zip(h.episode_returns, h.episode_lengths)]


def _store_episodes(url: str) -> collections.Counter:
    """``(return, length)`` of the store's complete episodes, from its own reward arrays."""
    return collections.Counter((e.total_reward, e.length)
                               for e in daskrl.data.episodes(daskrl.open_store(url), keys=["reward"]))


def _documented_keys(workers) -> set[str]:
    """:data:`METRIC_KEYS` with ``{worker}`` filled in for each of ``workers`` (addresses)."""
    return {k.replace("workers/{worker}/", worker_key(w, "")) for k in METRIC_KEYS
            for w in workers}


def test_tensorboard_events_are_the_collections_metrics(client, tmp_path):
    env = gym.make("CartPole-v1")
    torch.manual_seed(0)
    policy = MLPPolicy(env.observation_space, env.action_space)
    url = str(tmp_path / "store")
    tb, recorder = TensorBoardLogger(tmp_path / "tb"), Recorder()

    def flaky(metrics, step):
        raise ConnectionError("dashboard down")

    handles = []
    with (
        pytest.warns(MetricsLoggerWarning, match="raised ConnectionError: dashboard down") as w,
        daskrl.Collector("CartPole-v1", policy, url, client=client, rounds=False,
                         envs_per_worker=4, frames_per_batch=256, total_frames=4096,
                         batches_in_flight=2, seed=3, loggers=[tb, recorder, flaky]) as collector,
    ):
        for handle in collector:
            handles.append(handle)
            collector.update_weights(policy)  # lags of 1 and more, batch versions apart
        summary = collector.summary()
    assert len(w) == 1  # warned once, then dropped; the collection went on
    assert recorder.closed == 1 and summary["frames"] == 4096 and len(handles) == 16
    ev = scalars(tmp_path / "tb")
    steps = _steps(handles)
    # Every episode, at the step of the batch it finished in, as the handles and the store say.
    episodes = _episodes_of(handles)
    assert len(episodes) == summary["episodes"] > 50
    assert ev["charts/episodic_return"] == [(s, r) for s, r, _ in episodes]
    assert ev["charts/episodic_length"] == [(s, n) for s, _, n in episodes]
    from_store = _store_episodes(url)
    assert collections.Counter((r, n) for _, r, n in episodes) == from_store
    assert sum(from_store.values()) == summary["episodes"]
    # One value per batch of each batch figure, at its step.
    for key in ("charts/SPS", "collector/batches", "collector/policy_lag"):
        assert [s for s, _ in ev[key]] == steps, key
    assert [v for _, v in ev["collector/batches"]] == list(range(1, 17))
    assert [v for _, v in ev["collector/policy_lag"]] == [h.policy_lag for h in handles]
    assert max(h.policy_lag for h in handles) >= 1
    assert [v for _, v in ev["collector/batch_weights_version"]] == [
        h.weights_version for h in handles]
    assert [v for _, v in ev["collector/weights_version"]] == [
        h.weights_version + h.policy_lag for h in handles]
    assert ev["collector/episodes"][-1][1] == summary["episodes"]
    assert ev["collector/policy_lag_mean"][-1][1] == pytest.approx(summary["policy_lag_mean"])
    assert all(v > 0 for _, v in ev["charts/SPS"])
    # Store bytes: the containers of the batches handed over, as the store lists them.
    sizes = daskrl.open_store(url).attempt_sizes()
    assert ev["collector/store_bytes"][-1][1] == sum(sizes[h.path][0] for h in handles) > 0
    assert [v for _, v in ev["collector/store_bytes"]] == sorted(
        v for _, v in ev["collector/store_bytes"])
    # Per worker: a value per batch of that worker; the last one is the summary's.
    for address, figures in summary["workers"].items():
        rollout = ev[worker_key(address, "rollout_fps")]
        assert len(rollout) == len(ev[worker_key(address, "fps")]) == figures["batches"]
        assert rollout[-1][1] == pytest.approx(figures["rollout_fps"], rel=1e-6)  # float32
    assert set(ev) == _documented_keys(summary["workers"])
    # The unpicklable recorder got the same calls (it never left this process).
    assert [(s, m["charts/episodic_return"]) for s, m in recorder.calls
            if EPISODIC[0] in m] == [(s, r) for s, r, _ in episodes]
    # Loggers are no part of the run record.
    assert "logger" not in json.dumps(daskrl.open_store(url).runs()).lower()


def test_hand_over_and_an_asynchronous_client_feed_the_loggers(cluster, tmp_path):
    recorder = Recorder()

    async def main() -> list[daskrl.BatchHandle]:
        async with Client(cluster.scheduler_address, asynchronous=True) as client:
            tb = TensorBoardLogger(tmp_path / "tb")
            async with daskrl.Collector(COUNTING, TagPolicy(), str(tmp_path / "s"), client=client,
                                        rounds=False, envs_per_worker=2, frames_per_batch=10,
                                        total_frames=60, loggers=[tb, recorder]) as collector:
                handles = [collector.hand_over(await (await collector.submit()))
                           for _ in range(2)]
                handles += [h async for h in collector]
            return handles  # closed by `async with`: the event file is flushed

    handles = asyncio.run(main())
    assert len(handles) == 6 and recorder.closed == 1
    ev = scalars(tmp_path / "tb")
    assert [s for s, _ in ev["collector/batches"]] == _steps(handles) == list(range(10, 70, 10))
    # Two envs, five steps each per batch: each batch ends one episode per env (return 15).
    assert ev["charts/episodic_return"] == [(s, 15.0) for s in _steps(handles) for _ in "ab"]
    assert ev["charts/episodic_length"] == [(s, 5.0) for s in _steps(handles) for _ in "ab"]
    assert [c[0] for c in recorder.calls if "collector/batches" in c[1]] == _steps(handles)


def test_cli_tensorboard_writes_the_event_files(cluster, tmp_path):
    store, tb = tmp_path / "store", tmp_path / "tb"
    out = daskrl_main("collect", "--env", "CartPole-v1", "--frames", "2048",
                      "--frames-per-batch", "512", "--store", str(store), "--scheduler",
                      cluster.scheduler_address, "--tensorboard", str(tb), "--json",
                      cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    ev = scalars(tb)
    assert [s for s, _ in ev["charts/SPS"]] == [512, 1024, 1536, 2048]
    assert ev["collector/episodes"][-1][1] == summary["episodes"]
    returns = ev["charts/episodic_return"]
    lengths = ev["charts/episodic_length"]
    assert collections.Counter(
        (r, n) for (_, r), (_, n) in zip(returns, lengths)) == _store_episodes(str(store))
    handles = daskrl.open_store(str(store)).handles()
    assert ev["collector/store_bytes"][-1][1] == sum(
        (store / h.path).stat().st_size for h in handles)


def test_cli_tensorboard_without_the_extra_says_what_to_install(cluster, tmp_path, monkeypatch):
    # tensorboard made unimportable in this process, as where it is not installed: torch's
    # tensorboard modules, imported here already, are imported anew (and fail on `import
    # tensorboard`); the modules are put back after the test.
    for name in [n for n in sys.modules if n.split(".")[0] == "tensorboard"
                 or f"{n}.".startswith("torch.utils.tensorboard.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    out = daskrl_main("collect", "--env", "CartPole-v1", "--frames", "1024", "--store",
                      str(tmp_path / "s"), "--tensorboard", str(tmp_path / "tb"),
                      "--scheduler", cluster.scheduler_address, cwd=tmp_path)
    assert out.returncode == 3, out.stderr
    assert 'pip install "daskrl[tensorboard]"' in out.stderr
    assert not (tmp_path / "s").exists()  # nothing started


def _wandb_history(run_file: Path) -> list[dict]:
    """The history rows of an offline W&B run file (LevelDB-log records of ``Record`` protos,
    read with W&B's own protobuf schema)."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, pending, rows = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL, LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
    return rows


def test_wandb_offline_run_has_every_episode(client, tmp_path, monkeypatch):
    import wandb

    for var in ("DIR", "CONFIG_DIR", "CACHE_DIR", "DATA_DIR", "ARTIFACT_DIR"):
        monkeypatch.setenv(f"WANDB_{var}", str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    try:
        wb = WandbLogger(project="daskrl-test", dir=str(tmp_path), mode="offline",
                         settings=wandb.Settings(console="off", x_disable_stats=True))
        run_dir = Path(wb.run.dir).parent
        with daskrl.Collector(COUNTING, TagPolicy(), str(tmp_path / "s"), client=client,
                              envs_per_worker=2, frames_per_batch=10, total_frames=40,
                              loggers=[wb]) as collector:
            handles = list(collector)
    finally:
        wandb.teardown()  # the W&B service process ends with it
    rows = _wandb_history(next(run_dir.glob("run-*.wandb")))
    episodes = [(r["global_step"], r["charts/episodic_return"], r["charts/episodic_length"])
                for r in rows if "charts/episodic_return" in r]
    assert episodes == _episodes_of(handles) == [(s, 15.0, 5) for s in (10, 20, 30, 40)
                                                 for _ in "ab"]
    batches = [(r["global_step"], r["collector/batches"]) for r in rows
               if "collector/batches" in r]
    assert batches == [(10, 1), (20, 2), (30, 3), (40, 4)]


def test_mlflow_file_store_run_has_every_episode(client, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 prefers a database
    uri = (tmp_path / "mlruns").as_uri()
    mlf = MLflowLogger(tracking_uri=uri, experiment_name="daskrl-test", run_name="counting")
    with daskrl.Collector(COUNTING, TagPolicy(), str(tmp_path / "s"), client=client,
                          envs_per_worker=2, frames_per_batch=10, total_frames=40,
                          loggers=[mlf]) as collector:
        handles = list(collector)
    mc = MlflowClient(uri)
    run = mc.get_run(mlf.run_id)
    assert run.info.status == "FINISHED"  # created by the logger, finished with the collector
    history = mc.get_metric_history(mlf.run_id, "charts/episodic_return")
    assert sorted((m.step, m.value) for m in history) == [(s, r) for s, r, _ in
                                                          _episodes_of(handles)]
    batches = mc.get_metric_history(mlf.run_id, "collector/batches")
    assert sorted((m.step, m.value) for m in batches) == [(10, 1), (20, 2), (30, 3), (40, 4)]
    assert not math.isnan(run.data.metrics["charts/SPS"])
    assert set(run.data.metrics) == _documented_keys({h.worker for h in handles})
    # A run of the caller's is left open.
    mine = mc.create_run(mc.get_experiment_by_name("daskrl-test").experiment_id)
    MLflowLogger(mine.info.run_id, tracking_uri=uri).close()
    assert mc.get_run(mine.info.run_id).info.status == "RUNNING"


@pytest.mark.slow
def test_ppo_example_logs_to_tensorboard(cluster, tmp_path):
    run = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "ppo_cartpole.py"), "--total-frames", "2048",
         "--run-dir", str(run), "--scheduler", cluster.scheduler_address, "--update-epochs",
         "2", "--no-progress", "--no-plot", "--tensorboard", str(run / "tb")],
        capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads((run / "result.json").read_text())
    ev = scalars(run / "tb")
    # The learner's losses and the collector's metrics in one run, under cleanrl's keys.
    assert [s for s, _ in ev["losses/policy_loss"]] == [512, 1024, 1536, 2048]
    assert len(ev["charts/episodic_return"]) == result["episodes"]
    assert [s for s, _ in ev["charts/SPS"]] == [256 * i for i in range(1, 9)]
    assert {"charts/learning_rate", "losses/value_loss", "losses/approx_kl"} <= set(ev)
