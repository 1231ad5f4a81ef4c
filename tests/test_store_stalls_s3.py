"""A writer stopped (SIGSTOP) between its container and its commit on a real S3-protocol
server (moto on loopback): the collector removes its container meanwhile, and the resumed
writer must not commit a batch that cannot be read."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import daskrl
from daskrl.store import TrajectoryStore

sys.path.insert(0, str(Path(__file__).parent))
from store_writer_proc import batch_arrays
from test_store_s3 import s3, s3_endpoint  # noqa: F401 - fixtures

SCRIPT = str(Path(__file__).parent / "store_writer_proc.py")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


def _wait_for(pred, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_stopped_s3_writer_writes_its_batch_again_after_gc(s3, tmp_path):  # noqa: F811
    url, options = s3
    marker = tmp_path / "stopped"
    p = subprocess.Popen([sys.executable, SCRIPT, "stop", url, "2", "9", str(marker),
                          "before-commit", json.dumps(options)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(marker.exists, "the writer to stop before its commit")
        _wait_for(lambda: _stopped(p.pid), "SIGSTOP")
        report = TrajectoryStore(url, options, read_only=False).collect_garbage(older_than=0)
        assert len(report.attempts) == 1 and report.attempts[0].startswith("batches/000000000009-")
    finally:
        p.send_signal(signal.SIGCONT)
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
    assert p.returncode == 0 and out.split() == ["9", "1"], err
    store = daskrl.open_store(url, options)
    assert store.batch_ids() == [9]
    assert store.records()[9]["path"] != report.attempts[0]
    got = store.load(9)
    for name, want in batch_arrays(9, 2).items():
        np.testing.assert_array_equal(got[name].numpy(), want)
    assert "was removed by a garbage collector before its commit" in err
