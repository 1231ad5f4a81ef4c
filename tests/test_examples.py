"""The examples, run as users run them (subprocesses) with tiny budgets on the session cluster.

The full runs (PPO to 475, DQN to 400) take minutes and are reported in the examples' notes;
here each example must start, learn a little, log its metrics and report.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import daskrl

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _run(script: str, *args: str, cwd: Path) -> str:
    out = subprocess.run([sys.executable, str(EXAMPLES / script), *args, "--no-progress"],
                         capture_output=True, text=True, timeout=240, cwd=cwd)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def _metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def scheduler(cluster):
    """The session cluster's address; the examples must leave nothing published on it."""
    from distributed import Client

    yield cluster.scheduler_address
    with Client(cluster.scheduler_address, set_as_default=False) as client:
        assert not client.list_datasets()


def test_ppo_cartpole_smoke(scheduler, tmp_path):
    out = _run("ppo_cartpole.py", "--total-frames", "2048", "--run-dir", str(tmp_path / "run"),
               "--scheduler", scheduler, "--update-epochs", "2", cwd=tmp_path)
    assert re.search(r"^frames: 2048  time: [\d.]+s  SPS: \d+  episodes: \d+$", out, re.M), out
    assert re.search(r"^target 475 (not reached|reached at \d+ frames)$", out, re.M), out
    rows = _metrics(tmp_path / "run" / "metrics.jsonl")
    keys = set().union(*rows)
    assert {"charts/episodic_return", "charts/SPS", "losses/policy_loss", "losses/value_loss",
            "losses/approx_kl", "collector/policy_lag_mean"} <= keys
    assert {r["collector/policy_lag_mean"] for r in rows if "collector/policy_lag_mean" in r} == {0}
    updates = [r for r in rows if "losses/policy_loss" in r]
    assert len(updates) == 4  # 2048 frames = 4 rounds of 2 x 256
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["frames"] == 2048
    assert (tmp_path / "run" / "curve.png").stat().st_size > 1000


@pytest.mark.parametrize("recurrent", [True, False], ids=["gru", "mlp"])
def test_ppo_recurrent_smoke(scheduler, tmp_path, recurrent):
    flag = "--recurrent" if recurrent else "--no-recurrent"
    out = _run("ppo_recurrent.py", flag, "--total-frames", "4096", "--run-dir",
               str(tmp_path / "run"), "--scheduler", scheduler, "--update-epochs", "2",
               cwd=tmp_path)
    assert re.search(r"^frames: 4096  time: [\d.]+s  SPS: \d+  episodes: \d+$", out, re.M), out
    rows = _metrics(tmp_path / "run" / "metrics.jsonl")
    updates = [r for r in rows if "losses/policy_loss" in r]
    assert len(updates) == 4  # 4096 frames = 4 rounds of 2 workers x 16 envs x 32 steps
    if recurrent:
        # every round replayed on the learner from the stored policy_state and is_init gives
        # the log-probabilities the workers sampled with
        assert all(r["replay/max_log_prob_error"] < 1e-5 for r in updates), updates
    else:
        assert not any("replay/max_log_prob_error" in r for r in updates)
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["policy"] == ("gru" if recurrent else "mlp")
    assert result["frames"] == 4096


def test_dqn_cartpole_smoke(scheduler, tmp_path):
    out = _run("dqn_cartpole.py", "--total-frames", "2048", "--learning-starts", "512",
               "--run-dir", str(tmp_path / "run"), "--scheduler", scheduler, "--no-plot",
               "--gradient-steps-per-frame", "0.05", "--max-policy-lag", "5", cwd=tmp_path)
    assert re.search(r"^frames: 2048  time: [\d.]+s  SPS: \d+  episodes: \d+  "
                     r"gradient steps: \d+$", out, re.M), out
    assert re.search(r"^policy lag: mean [\d.]+, max \d, batches by lag \{.*\}, dropped as "
                     r"stale \d+$", out, re.M), out
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    # Learning starts with the batch that brings 512 frames: 0.05 steps per frame of 7 batches.
    assert result["frames"] == 2048 and result["gradient_steps"] == int(0.05 * 7 * 256)
    assert 0 <= result["policy_lag_max"] <= 5
    rows = _metrics(tmp_path / "run" / "metrics.jsonl")
    assert {"charts/episodic_return", "charts/SPS", "losses/td_loss", "charts/epsilon",
            "collector/policy_lag"} <= set().union(*rows)


def test_fsx_collect_then_train_without_a_cluster(scheduler, tmp_path):
    store = tmp_path / "shared" / "cartpole-random"
    out = _run("fsx_collect.py", "--store", str(store), "--total-frames", "4096",
               "--scheduler", scheduler, cwd=tmp_path)
    assert re.search(r"^collected 4096 frames in 4 batches", out, re.M), out
    out = _run("fsx_train.py", "--store", str(store), "--epochs", "2", "--eval-episodes", "2",
               "--save", str(tmp_path / "q.pt"), cwd=tmp_path)
    assert "4 batches, 4096 frames of CartPole-v1" in out
    assert re.search(r"^epoch 1: losses/td_loss [\d.]+  gradient steps 32 ", out, re.M), out
    assert re.search(r"^greedy policy on 2 local episodes: mean return [\d.]+", out, re.M), out
    assert (tmp_path / "q.pt").exists()


def test_atari_pong_smoke(scheduler, tmp_path):
    out = _run("atari_pong.py", "--total-frames", "256", "--envs-per-worker", "2",
               "--frames-per-batch", "64", "--run-dir", str(tmp_path / "run"),
               "--scheduler", scheduler, cwd=tmp_path)
    assert "observation space Box(0, 255, (4, 84, 84), uint8), action space Discrete(6)" in out
    assert re.search(r"^frames: 256  time: [\d.]+s  SPS: \d+  episodes: 0$", out, re.M), out
    assert re.search(r"^stored: \d+ bytes per frame \(compression ratio \d+;", out, re.M), out
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["frames"] == 256 and 0 < result["bytes_per_frame"] < 2 * 4 * 84 * 84
    store = daskrl.open_store(str(tmp_path / "run" / "store"))
    assert store.runs()[0]["settings"]["wrappers"] == [
        "gymnasium.wrappers.AtariPreprocessing",
        "gymnasium.wrappers.FrameStackObservation:stack_size=4"]
    rows = _metrics(tmp_path / "run" / "metrics.jsonl")
    assert {"charts/SPS", "values/mean"} <= set().union(*rows)


def test_mujoco_halfcheetah_smoke(tmp_path):
    # Its own embedded cluster, in tmp_path: MuJoCo 4 writes MUJOCO_LOG.TXT where it runs.
    out = _run("mujoco_halfcheetah.py", "--total-frames", "400", "--random-frames", "200",
               "--frames-per-batch", "200", "--max-episode-steps", "50", "--num-workers", "1",
               "--float32", "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert re.search(r"^frames: 400  time: [\d.]+s  SPS: \d+  episodes: 8  mean return: "
                     r"-?[\d.]+$", out, re.M), out
    assert "random actions within the bounds: True" in out
    store = daskrl.open_store(str(tmp_path / "run" / "store"))
    batch = store.handles()[0].load()
    assert batch["observation"].dtype == torch.float32 and batch["action"].shape[-1] == 6
    rows = _metrics(tmp_path / "run" / "metrics.jsonl")
    assert len([r for r in rows if "charts/episodic_return" in r]) == 8
