"""Garbage collection's arguments and a read-only store, checked without a writer process.
(Atomic batches under real OS processes: tests/test_store_processes.py.)"""

from __future__ import annotations

import os

import pytest

import daskrl
from daskrl.store import TrajectoryStore


def test_gc_refuses_bad_input_and_read_only_stores(tmp_path):
    import re

    w = TrajectoryStore(str(tmp_path / "s"), read_only=False)
    w.initialize()
    with pytest.raises(daskrl.ConfigError, match=re.escape("older_than must be a number of seconds >= 0, got -1")):
        w.collect_garbage(older_than=-1)
    r = daskrl.open_store(str(tmp_path / "s"))
    with pytest.raises(daskrl.StoreError, match=re.escape("cannot collect garbage: store")):
        r.collect_garbage()
    assert r.collect_garbage(dry_run=True).attempts == ()
    assert os.path.isdir(tmp_path / "s" / "batches")
