"""Weights through shared memory, without Dask: segments of a dead learner (a real process)
are swept, and a full shared memory falls back to plain snapshots. (Segments read in place,
bit exact and checksummed, and refused reads: tests/unit/test_shared_memory.py.)"""

from __future__ import annotations

import os
import subprocess
import sys

from torch import nn

from daskrl.weights import weights_layout
from daskrl.weights._segments import Segment


def test_segments_of_a_dead_learner_are_swept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    stale = tmp_path / f"daskrl-weights-{int(dead.stdout)}-00ff"
    stale.write_bytes(b"x" * 100)
    mine = Segment(weights_layout(nn.Linear(2, 2)), str(tmp_path))
    assert not stale.exists() and os.path.exists(mine.path)
    assert oct(os.stat(mine.path).st_mode & 0o777) == "0o600"  # this user's only
    mine.close()
    assert not os.path.exists(mine.path)


def test_no_room_in_shared_memory_falls_back_to_plain_snapshots(tmpfs):
    big = nn.Linear(512, 512)  # 1 MiB: does not fit in 256 KiB
    assert Segment.create(weights_layout(big), str(tmpfs)) is None
    assert os.listdir(tmpfs) == []  # nothing half-made left behind
