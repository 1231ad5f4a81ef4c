"""The suite's last line against a hang: a pytest plugin that ends a run stuck past a timeout.

pytest-timeout interrupts a test with SIGALRM in the main thread. That cannot reach a main
thread blocked in C code, nor a teardown still running after the alarm fired (the alarm fires
once). Such a hang would stall CI until its own limit, and say nothing of where it was.

This plugin gives each test its pytest-timeout limit plus a grace (``GRACE_S``, or the
``DASKRL_TEST_HANG_GRACE_S`` environment variable). Past it, it prints which test hung and the
stack of every thread to the run's real stderr, ends this process's child processes (clusters,
daemons, subprocesses), and exits with status 1. A watchdog thread does that; should the hung
code never let go of the GIL, :func:`faulthandler.dump_traceback_later` prints the stacks and
exits 60 s later.

tests/conftest.py registers it; a run of its own loads it with ``-p hang_guard``.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
import traceback

import pytest

GRACE_S = 120.0
C_LEVEL_EXTRA_S = 60.0
_EXIT_STATUS = 1


class _Guard:
    """One watchdog thread; each test sets its deadline, and clears it when it is done."""

    def __init__(self, stderr_fd: int) -> None:
        self.stderr_fd = stderr_fd
        self.deadline: float | None = None
        self.nodeid = ""
        self.limit = 0.0
        self.changed = threading.Condition()
        threading.Thread(target=self._watch, name="daskrl-hang-guard", daemon=True).start()

    def arm(self, nodeid: str, limit: float) -> None:
        with self.changed:
            self.nodeid, self.limit = nodeid, limit
            self.deadline = time.monotonic() + limit
            self.changed.notify()
        faulthandler.dump_traceback_later(limit + C_LEVEL_EXTRA_S, exit=True,
                                          file=self.stderr_fd)

    def disarm(self) -> None:
        faulthandler.cancel_dump_traceback_later()
        with self.changed:
            self.deadline = None
            self.changed.notify()

    def _watch(self) -> None:
        with self.changed:
            while True:
                if self.deadline is None:
                    self.changed.wait()
                    continue
                left = self.deadline - time.monotonic()
                if left > 0:
                    self.changed.wait(left)
                    continue
                self._end_run()

    def _end_run(self) -> None:
        os.write(self.stderr_fd, (
            f"\n\n{self.nodeid} has run {self.limit:.0f} s, past its timeout and the hang "
            f"guard's grace (tests/hang_guard.py): every thread's stack follows, then this "
            f"run ends with status {_EXIT_STATUS}.\n").encode())
        faulthandler.dump_traceback(file=self.stderr_fd, all_threads=True)
        ended = _end_children()
        # again at the end, where a log's tail shows it: the test and its main thread's stack
        main = sys._current_frames().get(threading.main_thread().ident)
        stack = "".join(traceback.format_stack(main)[-12:]) if main is not None else "?\n"
        os.write(self.stderr_fd, (
            f"hang guard: {self.nodeid} hung; ended {ended} child processes; its main thread "
            f"was at (innermost last):\n{stack}").encode())
        os._exit(_EXIT_STATUS)


def _end_children() -> int:
    """Kill this process's descendants (so none outlives the run holding its output open)."""
    import psutil

    children = psutil.Process().children(recursive=True)
    for child in children:
        try:
            child.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(children, timeout=10)
    return len(children)


def _timeout_of(item: pytest.Item) -> float:
    """The test's pytest-timeout limit: its ``timeout`` mark, else the ini's ``timeout``."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.args[0] if marker.args else marker.kwargs.get("timeout")
        if value is not None:
            return float(value)
    option = item.config.getoption("timeout", None)
    if option is not None:
        return float(option)
    return float(item.config.getini("timeout") or 0)


_guard_key = pytest.StashKey[_Guard]()


def pytest_configure(config: pytest.Config) -> None:
    # fd 2 is still the run's own stderr here: output capturing starts after configure
    config.stash[_guard_key] = _Guard(os.dup(sys.stderr.fileno()))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    guard = item.config.stash[_guard_key]
    timeout = _timeout_of(item)
    if timeout <= 0:  # no timeout asked for: nothing to guard
        return (yield)
    grace = float(os.environ.get("DASKRL_TEST_HANG_GRACE_S", GRACE_S))
    guard.arm(item.nodeid, timeout + grace)
    try:
        return (yield)
    finally:
        guard.disarm()
