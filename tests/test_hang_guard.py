"""The hang guard (tests/hang_guard.py) ends a real pytest run stuck past a test's timeout."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

TESTS = Path(__file__).parent

HUNG_RUN = '''
import subprocess
import sys
import time

import pytest


@pytest.fixture
def slow_teardown():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open({pid_file!r}, "w") as f:
        f.write(str(child.pid))
    yield
    time.sleep(600)  # a teardown that outlives the timeout's one alarm


@pytest.mark.timeout(1)
def test_hangs(slow_teardown):
    time.sleep(600)


def test_after_it():
    pass
'''


@pytest.mark.timeout(120)
def test_a_teardown_stuck_past_the_timeout_ends_the_run_with_stacks_and_no_children(tmp_path):
    pid_file = tmp_path / "child.pid"
    (tmp_path / "test_hung.py").write_text(HUNG_RUN.format(pid_file=str(pid_file)))
    env = {**os.environ, "PYTHONPATH": str(TESTS), "DASKRL_TEST_HANG_GRACE_S": "3"}
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "hang_guard",
                          "-p", "no:cacheprovider", "test_hung.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=100)
    took = time.monotonic() - started
    assert run.returncode == 1, (run.stdout, run.stderr)
    assert "test_hung.py::test_hangs has run 4 s, past its timeout" in run.stderr, run.stderr
    # every thread's stack, the main thread's showing where it was stuck
    assert "Current thread" in run.stderr and "in slow_teardown" in run.stderr, run.stderr
    tail = run.stderr[run.stderr.index("hang guard: "):]  # what a log's tail shows
    assert tail.startswith("hang guard: test_hung.py::test_hangs hung; ended 1 child processes")
    assert "time.sleep(600)  # a teardown that outlives" in tail, tail
    assert "passed" not in run.stdout  # the run ended there: test_after_it never ran
    assert took < 60, took  # not the teardown's 600 s, nor the C-level watchdog's extra 60
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(child), f"the hung run's child {child} outlived it"


def _gone(pid: int) -> bool:
    """Ended: no such process, or a zombie waiting for its reaper."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
