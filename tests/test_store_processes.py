"""Atomic, idempotent batches under real OS processes: concurrent writers, duplicate commits,
writers killed mid-write (SIGKILL), and garbage collection that spares running writers. (Its
arguments, without a writer process: tests/unit/test_store_processes.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

import daskrl
from daskrl.store import TrajectoryStore

sys.path.insert(0, str(Path(__file__).parent))
from store_writer_proc import batch_arrays

SCRIPT = str(Path(__file__).parent / "store_writer_proc.py")
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


def _spawn(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, SCRIPT, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_for(pred, timeout=120.0, what=""):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _check_batch_whole(store, bid):
    """A batch's arrays all come from the one writer its commit record names."""
    rec = store.records()[bid]
    tag = int(rec["weights_version"])
    got = store.load(bid)
    for name, want in batch_arrays(bid, tag, width=got["observation"].shape[-1]).items():
        np.testing.assert_array_equal(got[name].numpy(), want, err_msg=f"batch {bid} {name}")
    return tag


def _finish(procs):
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        outs.append(out)
    return outs


def test_concurrent_writer_processes_and_a_duplicate_commit(tmp_path):
    url = str(tmp_path / "store")
    go = tmp_path / "go"
    # Two processes write disjoint ids; two more race on the same six ids.
    procs = [_spawn("write", url, tag, first, 6, go)
             for tag, first in ((1, 0), (2, 100), (4, 300), (5, 300))]
    time.sleep(1.0)  # most imports done: start together
    go.touch()
    outs = _finish(procs)
    store = daskrl.open_store(url)
    assert store.batch_ids() == [*range(0, 6), *range(100, 106), *range(300, 306)]
    for bid in store.batch_ids():
        tag = _check_batch_whole(store, bid)
        if bid < 300:
            assert tag == 1 + bid // 100
    # exactly one of the racing writers committed each contested id; the other saw a duplicate
    wins = {tag: {int(line.split()[0]) for line in out.splitlines() if line.endswith(" 1")}
            for tag, out in ((4, outs[2]), (5, outs[3]))}
    assert wins[4] | wins[5] == set(range(300, 306)) and not wins[4] & wins[5]
    for bid in range(300, 306):
        assert int(store.records()[bid]["weights_version"]) == (4 if bid in wins[4] else 5)
    # the losers removed their own attempts: one container per batch remains, the committed one
    attempts = sorted(p.name for p in (tmp_path / "store" / "batches").iterdir()
                      if p.name != "zarr.json")
    assert attempts == sorted(store.records()[b]["path"].split("/")[1] for b in store.batch_ids())
    assert len(store.runs()) == 0 and store.frames == 18 * 32 * 4


def test_killed_writer_leaves_no_visible_batch_and_gc_spares_running_writers(tmp_path):
    url = str(tmp_path / "store")
    root = tmp_path / "store"
    w = TrajectoryStore(url, read_only=False)
    w.initialize()
    w.write_batch(1, batch_arrays(1, 9), {**_meta(9)}, compression="none")

    # A writer paused inside its commit (all data written, commit temp file not yet linked).
    marker, resume = tmp_path / "m1", tmp_path / "r1"
    p = _spawn("pause", url, 7, 7, marker, resume)
    _wait_for(marker.exists, what="writer of batch 7 to reach its commit")
    store = daskrl.open_store(url)
    assert store.batch_ids() == [1]
    assert list((root / "commits" / "000000000007").glob("zarr.*.partial"))
    report = w.collect_garbage(older_than=60)
    assert report.attempts == () and report.partial_files == ()
    assert any(k.startswith("batches/000000000007-") for k in report.kept)
    resume.touch()  # the writer goes on, undisturbed
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0 and out.split() == ["7", "1"], err
    assert store.batch_ids() == [1, 7]
    _check_batch_whole(store, 7)

    # The same writer, killed there: its data and its commit's temp file stay behind.
    marker, resume = tmp_path / "m2", tmp_path / "r2"
    p = _spawn("pause", url, 8, 8, marker, resume)
    _wait_for(marker.exists, what="writer of batch 8 to reach its commit")
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL
    debris = [d for d in (root / "batches").iterdir() if d.name.startswith("000000000008-")]
    assert len(debris) == 1 and debris[0].suffix == ".zip"
    with zipfile.ZipFile(debris[0]) as z:  # written whole before the commit began
        assert z.testzip() is None and "observation/zarr.json" in z.namelist()
    [partial] = (root / "commits" / "000000000008").glob("zarr.*.partial")
    assert store.batch_ids() == [1, 7] and len(store) == 2
    report = w.collect_garbage(older_than=0)
    assert report.attempts == (f"batches/{debris[0].name}",)
    assert report.partial_files == (partial.relative_to(root).as_posix(),)
    assert report.bytes > 32 * 4 * 512 * 4
    assert not debris[0].exists() and not (root / "commits" / "000000000008").exists()
    assert store.batch_ids() == [1, 7]
    for bid in (1, 7):
        _check_batch_whole(store, bid)
    assert not list(root.rglob("*.partial"))


def test_pruning_under_a_running_writer_then_sigkill_at_a_random_moment(tmp_path):
    url = str(tmp_path / "store")
    root = tmp_path / "store"
    p = _spawn("loop", url, 3, 0)
    loaded = deleted = 0
    try:
        _wait_for(lambda: len(list((root / "commits").glob("*/zarr.json"))) >= 3
                  if (root / "commits").exists() else False, what="three commits")
        pruner = daskrl.open_store(url, writable=True)
        reader = daskrl.open_store(url)
        for _ in range(4):  # keep the newest two while the writer adds more, and read along
            deleted += len(pruner.keep_last(2))
            for bid in reader.batch_ids():
                try:
                    _check_batch_whole(reader, bid)  # whole, or reported deleted: never torn
                    loaded += 1
                except daskrl.BatchNotFoundError:
                    pass
            time.sleep(0.02)
        time.sleep(np.random.default_rng().uniform(0, 0.05))
    finally:
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=60)
    assert deleted >= 1 and loaded >= 2
    store = daskrl.open_store(url)
    ids = store.batch_ids()
    assert len(ids) >= 2 and ids == list(range(ids[0], ids[0] + len(ids)))  # the writer went on
    for bid in ids:
        _check_batch_whole(store, bid)
    w = TrajectoryStore(url, read_only=False)
    w.collect_garbage(older_than=0)
    left = sorted(d.name for d in (root / "batches").iterdir() if d.name != "zarr.json")
    assert left == sorted(store.records()[b]["path"].split("/")[1] for b in ids)
    assert not list(root.rglob("*.partial"))
    for bid in ids:
        _check_batch_whole(store, bid)


def _meta(tag):
    from store_writer_proc import meta

    return meta(tag)


def _stopped(p: subprocess.Popen) -> bool:
    """Whether ``p`` is stopped by a signal (state ``T`` in /proc)."""
    with open(f"/proc/{p.pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


def _age(root: Path, seconds: float = 7200.0) -> None:
    """Set every file's times under ``root``'s batches/ and commits/ ``seconds`` back: as if
    the writer had been stopped that long."""
    for sub in ("batches", "commits"):
        for p in (root / sub).rglob("*"):
            st = p.stat()
            os.utime(p, (st.st_atime - seconds, st.st_mtime - seconds))


def _continue(p: subprocess.Popen) -> tuple[str, str]:
    p.send_signal(signal.SIGCONT)
    try:
        out, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise
    assert p.returncode == 0, err
    return out, err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("where", ["before-commit", "in-link"])
def test_a_writer_stopped_past_the_grace_period_never_commits_a_collected_container(
        tmp_path, where):
    url = str(tmp_path / "store")
    root = tmp_path / "store"
    marker = tmp_path / "stopped"
    p = _spawn("stop", url, 6, 6, marker, where)
    try:
        _wait_for(marker.exists, what=f"the writer of batch 6 to stop {where}")
        _wait_for(lambda: _stopped(p), what="SIGSTOP")
        [container] = [c for c in (root / "batches").iterdir() if c.name.startswith("0000")]
        _age(root)  # stopped for two hours, past the collector's one-hour grace
        report = TrajectoryStore(url, read_only=False).collect_garbage()
        assert report.attempts == (f"batches/{container.name}",)
        assert len(report.partial_files) == (where == "in-link")
        assert not container.exists()
    finally:
        out, _ = _continue(p)
    assert out.split() == ["6", "1"]
    store = daskrl.open_store(url)
    assert store.batch_ids() == [6]
    assert (root / store.records()[6]["path"]).is_file()
    assert store.records()[6]["path"] != f"batches/{container.name}"  # written again
    _check_batch_whole(store, 6)
    assert TrajectoryStore(url, read_only=False).collect_garbage(0).attempts == ()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_collector_stopped_before_its_delete_never_removes_a_container_committed_meanwhile(
        tmp_path):
    url = str(tmp_path / "store")
    root = tmp_path / "store"
    w_marker, gc_marker = tmp_path / "w", tmp_path / "gc"
    writer = _spawn("stop", url, 3, 3, w_marker, "before-commit")
    gc = None
    try:
        _wait_for(w_marker.exists, what="the writer to stop before its commit")
        _wait_for(lambda: _stopped(writer), what="SIGSTOP")
        _age(root)
        # The collector checks the container is uncommitted, then stops just before deleting.
        gc = _spawn("gc", url, gc_marker)
        _wait_for(gc_marker.exists, what="the collector to stop before its delete")
        _wait_for(lambda: _stopped(gc), what="SIGSTOP")
        out, _ = _continue(writer)  # the writer commits while the collector is stopped
        assert out.split() == ["3", "1"]
    finally:
        for proc in (writer, gc):
            if proc is not None and proc.poll() is None:
                _continue(proc)
    store = daskrl.open_store(url)
    assert store.batch_ids() == [3]
    assert (root / store.records()[3]["path"]).is_file()
    _check_batch_whole(store, 3)
