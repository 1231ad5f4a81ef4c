"""The per-host copy of Dask-sent weights (daskrl.weights._host_copies.HostCopies), on real
files: copies and locks left by dead or killed workers (real processes). (The rest, in this
process: tests/unit/test_host_copies.py.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from tag_policies import tag_policy as _policy

from daskrl.weights import snapshot
from daskrl.weights._host_copies import HostCopies


@pytest.mark.timeout(60)
def test_a_lock_left_by_a_dead_worker_is_taken_over(tmp_path):
    copies = HostCopies("c2", directory=str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (tmp_path / "daskrl-host-c2-v1.lock").write_text(dead)
    assert copies.manifest("v1", wait=True) is None  # no bounded wait for a dead holder
    assert copies.claim("v1")
    copies.release("v1")
    assert not (tmp_path / "daskrl-host-c2-v1.lock").exists()


@pytest.mark.timeout(60)
def test_copies_of_killed_workers_are_swept(tmp_path):
    """A SIGKILLed worker never closes its copies: the next copy made on the host removes
    them (its segment, then the manifest pointing at it)."""
    code = ("import sys, os; from daskrl.weights._host_copies import HostCopies; "
            "from daskrl.weights import snapshot; from daskrl.testing import TagPolicy; "
            f"c = HostCopies('c5', directory={str(tmp_path)!r}); c.claim('v1'); "
            "c.publish('v1', snapshot(TagPolicy(), 1)); os._exit(0)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert (tmp_path / "daskrl-host-c5-v1.json").exists()
    (tmp_path / "daskrl-host-c5-v9.lock").write_text("999999999")
    copies = HostCopies("c5", directory=str(tmp_path))
    assert copies.claim("v2")
    copies.publish("v2", snapshot(_policy(1.0), 2))
    copies.close()
    assert os.listdir(tmp_path) == []
