"""Each exit status of the ``daskrl`` command, reached by the real command in a subprocess:
2 usage (the installed ``daskrl`` entry point), 3 configuration, 1 runtime (an env raising on
the workers mid-collection), 130 and 143 interrupted (Ctrl-C to the command's process group,
SIGTERM to the command), with the batches committed before the end intact and no process of
the command left behind. Further messages of a class are checked in this process
(``tests/cli_inprocess.py``; more in ``tests/test_cli_errors.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cli_inprocess import daskrl_main

import daskrl
from daskrl.cli._exit import CONFIG, INTERRUPTED, RUNTIME, TERMINATED, USAGE
from daskrl.testing import check_episode_continuity

pytestmark = pytest.mark.timeout(300)


DASKRL = [str(Path(sys.executable).with_name("daskrl"))]
"""The installed entry point: the console script next to this Python (``python -m daskrl.cli``
where there is none, e.g. a source tree on ``PYTHONPATH``)."""
if not Path(DASKRL[0]).is_file():
    DASKRL = [sys.executable, "-m", "daskrl.cli"]


def _daskrl(*args: str) -> list[str]:
    return [sys.executable, "-m", "daskrl.cli", *args]


def _run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(_daskrl(*args), capture_output=True, text=True, timeout=timeout)


def _check_intact(store: Path, frames_per_batch: int, envs: int) -> list[int]:
    """Every committed batch of ``store`` reads in full (checksums checked on read), holds
    ``frames_per_batch`` real transitions, and its ids are 0, 1, 2...: each batch once."""
    s = daskrl.open_store(str(store))
    ids = s.batch_ids()
    assert ids == list(range(len(ids))), ids
    for bid in ids:
        batch = s.load(bid)
        steps = frames_per_batch // envs
        assert batch["reward"].shape == (steps, envs), bid
        assert s.records()[bid]["frames"] == frames_per_batch
        # the stored transitions are continuous: each step's observation is the last one's
        # next observation, except where an episode ended
        done = batch["terminated"] | batch["truncated"]
        same = torch.isclose(batch["observation"][1:], batch["next_observation"][:-1]).all(-1)
        assert bool((same | done[:-1]).all()), bid
    check_episode_continuity(s)  # and across batches
    return ids


def test_an_unknown_option_is_a_usage_error(tmp_path):
    out = subprocess.run([*DASKRL, "collect", "--env", "CartPole-v1", "--store",
                          str(tmp_path / "s"), "--no-such-option"],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == USAGE, out
    assert out.stderr.splitlines()[-1] == ("daskrl: error: unrecognized arguments: "
                                           "--no-such-option")
    assert not (tmp_path / "s").exists()


def test_frames_per_batch_not_a_multiple_of_envs_is_a_configuration_error(tmp_path):
    out = _run("collect", "--env", "CartPole-v1", "--store", str(tmp_path / "s"),
               "--frames-per-batch", "30", "--envs-per-worker", "4")
    assert out.returncode == CONFIG, out
    assert out.stderr.startswith("daskrl: error: frames_per_batch=30 is not a multiple of "
                                 "envs_per_worker=4"), out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "s").exists()  # refused before anything was made


def test_an_env_the_learner_cannot_make_is_a_configuration_error(tmp_path):
    out = daskrl_main("collect", "--env", "CartPole-v1", "--env-kwargs", '{"gravty": 9.8}',
                      "--store", str(tmp_path / "s"))
    assert out.returncode == CONFIG, out
    assert "daskrl: error: could not make env 'CartPole-v1': TypeError" in out.stderr


def test_an_env_raising_on_the_workers_is_a_runtime_error(tmp_path):
    # FaultyEnv raises from its 40th step on (counted per worker process): batches 0 and 1
    # (16 steps each over 2 envs) are committed, batch 2 fails at its 4th step.
    store = tmp_path / "s"
    out = _run("collect", "--env", "daskrl.testing:Faulty-v0", "--env-kwargs",
               '{"fault": "raise", "at": 40, "length": 5}', "--store", str(store),
               "--frames", "160", "--frames-per-batch", "16", "--envs-per-worker", "2",
               "--workers", "1", "--no-progress", "--no-tls")
    assert out.returncode == RUNTIME, out
    assert out.stderr.splitlines()[-1].startswith(
        "daskrl: error: env 'daskrl.testing:Faulty-v0' (env index 1) raised in step() at "
        "step 3 of batch 2: RuntimeError('injected step failure') [worker tcp://127.0.0.1:"
    ), out.stderr
    assert _check_intact(store, 16, 2) == [0, 1]


def _wait_for_batches(proc: subprocess.Popen, store: Path, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, proc.communicate()
        try:
            if len(daskrl.open_store(str(store))) >= n:
                return
        except daskrl.DaskrlError:
            pass  # not created yet
        assert time.monotonic() < deadline, f"fewer than {n} batches after {timeout}s"
        time.sleep(0.2)


def _group_gone(pgid: int, timeout: float) -> bool:
    """Whether every process of the group has ended (within ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(("how", "status"), [("ctrl-c", INTERRUPTED), ("sigterm", TERMINATED)])
def test_an_interrupted_collection_exits_with_its_signal_and_keeps_its_batches(
        tmp_path, how, status):
    store = tmp_path / "s"
    proc = subprocess.Popen(
        _daskrl("collect", "--env", "CartPole-v1", "--store", str(store), "--frames", "none",
                "--frames-per-batch", "256", "--envs-per-worker", "4", "--workers", "1",
                "--no-progress"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _wait_for_batches(proc, store, 3, timeout=180)
        if how == "ctrl-c":  # a terminal sends SIGINT to the whole foreground process group
            os.killpg(proc.pid, signal.SIGINT)
        else:  # kill, scancel: the command's process only
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == status, err
    if how == "ctrl-c":
        assert err.splitlines()[-1] == "daskrl: interrupted", err
    assert len(_check_intact(store, 256, 4)) >= 3
    assert _group_gone(proc.pid, timeout=30), "a process of the command outlived it"
