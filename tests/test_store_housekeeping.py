"""Deleting batches under readers, keep-last-N, and the inspect / gc / prune commands (run in
this process: ``tests/cli_inprocess.py``)."""

from __future__ import annotations

import json
import re
import sys
import time

import numpy as np
import pytest
from cli_inprocess import daskrl_main

import daskrl
from daskrl.store import TrajectoryStore


def _write(url, n, compression="zstd"):
    w = TrajectoryStore(url, read_only=False)
    w.initialize()
    rng = np.random.default_rng(0)
    for bid in range(n):
        arrays = {"observation": np.repeat(rng.standard_normal((16, 2, 1)), 8, axis=2).astype(np.float32),
                  "reward": np.ones((16, 2), np.float32),
                  "terminated": np.zeros((16, 2), bool)}
        meta = {"frames": 32, "weights_version": bid // 2, "worker": f"tcp://w{bid % 2}",
                "device": "cpu", "episode_returns": [float(bid), float(bid) + 0.5],
                "episode_lengths": [10, 12], "shape": [16, 2]}
        w.write_batch(bid, arrays, meta, compression=compression)
    return w


def test_delete_and_keep_last_under_a_reader(tmp_path):
    url = str(tmp_path / "s")
    _write(url, 5)
    reader = daskrl.open_store(url)
    assert reader.batch_ids() == [0, 1, 2, 3, 4]
    with pytest.raises(daskrl.StoreError, match=re.escape("cannot delete batches: store")):
        reader.delete_batches([0])
    store = daskrl.open_store(url, writable=True)
    assert store.delete_batches([1, 99]) == [1]
    assert reader.batch_ids() == [0, 2, 3, 4]  # listings drop deleted batches
    assert not list((tmp_path / "s" / "batches").glob("000000000001-*"))
    # A reader that saw batch 2 committed, loading it while a deletion has removed the commit
    # record (deletion's first step) but no data yet: it is told, it does not get the data.
    handle = reader.handle(2)
    (tmp_path / "s" / "commits" / "000000000002" / "zarr.json").unlink()
    with pytest.raises(daskrl.BatchNotFoundError,
                       match=re.escape("batch 2 of ") + ".*" + re.escape("was deleted while it was being read")):
        handle.load()
    assert store.keep_last(2) == [0]  # batch 2 is already gone
    assert reader.batch_ids() == [3, 4] and reader.load(4)["reward"].shape == (16, 2)
    assert store.keep_last(5) == []
    with pytest.raises(daskrl.ConfigError, match=re.escape("keep_last takes an integer >= 0, got -1.")):
        store.keep_last(-1)
    # the orphaned data of batch 2 (its record went first) is garbage for the collector
    assert [a[:20] for a in store.collect_garbage(older_than=0).attempts] == ["batches/000000000002"]


_OPENED: list[str] | None = None  # while a list: the paths this process opens (audit hook)


def _audit(event: str, args: tuple) -> None:
    if _OPENED is not None and event == "open" and isinstance(args[0], str):
        _OPENED.append(args[0])


sys.addaudithook(_audit)


def test_a_listed_record_is_rechecked_by_identity_and_reread_when_changed(tmp_path):
    """After a read, a record the listing read is checked as the same file, unchanged (one
    lstat, no read); a record changed since (its times) is read again, and a deletion found."""
    global _OPENED
    url = str(tmp_path / "s")
    _write(url, 3)
    reader = daskrl.open_store(url)
    assert reader.batch_ids() == [0, 1, 2]
    record = tmp_path / "s" / "commits" / "000000000001" / "zarr.json"
    _OPENED = []
    try:
        assert reader.load(1)["reward"].shape == (16, 2)
        assert not [p for p in _OPENED if p.endswith(str(record))]  # the data only
        st, data = record.stat(), record.read_bytes()
        record.write_bytes(data)  # the same record, written again in place
        deadline = time.monotonic() + 10
        while record.stat().st_mtime_ns == st.st_mtime_ns:  # within the timestamp granularity
            assert time.monotonic() < deadline, "the record's mtime does not change"
            time.sleep(0.002)
            record.write_bytes(data)
        assert record.stat().st_ino == st.st_ino
        _OPENED.clear()
        assert reader.load(1)["reward"].shape == (16, 2)
        assert [p for p in _OPENED if p.endswith(str(record))] == [str(record)]  # read again
    finally:
        _OPENED = None
    record.unlink()  # deletion's first step, under a reader that listed the batch
    with pytest.raises(daskrl.BatchNotFoundError, match="was deleted while it was being read"):
        reader.load(1)
    assert reader.load(2)["reward"].shape == (16, 2)

def test_cli_inspect_gc_and_prune(tmp_path, capsys, monkeypatch):
    url = str(tmp_path / "s")
    _write(url, 4)
    dead = tmp_path / "s" / "batches" / "000000000009-deadbeef0000.zip"
    dead.write_text("{}")
    # a directory named like an attempt is no container of format 2.x: not the store's own
    foreign = tmp_path / "s" / "batches" / "000000000010-deadbeef0000"
    foreign.mkdir()
    (foreign / "zarr.json").write_text("{}")
    png = tmp_path / "returns.png"
    out = daskrl_main("inspect", url, "--plot", str(png))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for line in ("batches:           4", "frames:            128",
                 "episodes:          8 ended (mean length 11.00)",
                 "returns:           mean 1.75, std 1.15, min 0.00, max 3.50, mean of last 100 1.75",
                 "weights versions:  2 (0..1)", "workers:           2", f"plot: {png}"):
        assert line in text, (line, text)
    ratio = float(re.search(r"compression ratio (\d+\.\d+)", text).group(1))
    # arrays this small are stored raw (compression would save under 4 KiB of each): the ratio
    # is that of raw chunks with their 4-byte crc32c
    assert 0.9 < ratio < 1.0
    assert re.search(r"bytes on disk:     \d+\.\d KiB \(chunks \d+(\.\d)? (B|KiB) of 4\.6 KiB "
                     r"uncompressed: compression ratio", text), text
    assert "garbage:           2 B" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000

    from daskrl.data._inspect import summarize

    summary = summarize(daskrl.open_store(url))
    assert summary["bytes_uncompressed"] == 4 * (16 * 2 * 8 * 4 + 16 * 2 * 4 + 16 * 2)

    out = daskrl_main("gc", url, "--older-than", "0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("removed 1 uncommitted attempts and 0 partial files (2 bytes)")
    assert not dead.exists() and len(daskrl.open_store(url)) == 4
    assert (foreign / "zarr.json").read_text() == "{}"

    with monkeypatch.context() as hidden:  # matplotlib not installed, as far as imports go
        hidden.setitem(sys.modules, "matplotlib", None)
        out = daskrl_main("inspect", url, "--plot", str(png))
    assert out.returncode == 3  # a configuration error: an extra is not installed
    assert 'Install it with: pip install "daskrl[plot]"' in out.stderr

    from daskrl.cli import main  # the entry point itself: what daskrl_main runs

    capsys.readouterr()
    assert main(["prune", url, "--keep-last", "3"]) == 0
    assert capsys.readouterr().out.strip() == "deleted 1 batches; 3 remain"
    assert main(["inspect", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["batches"] == 3
    assert main(["inspect", str(tmp_path / "nowhere")]) == 1  # a runtime error: no store there
    assert "daskrl: error: no daskrl store at" in capsys.readouterr().err


def test_summary_json_of_an_empty_store(tmp_path):
    url = str(tmp_path / "s")
    TrajectoryStore(url, read_only=False).initialize()
    from daskrl.data._inspect import format_summary, summarize

    s = summarize(daskrl.open_store(url))
    assert s["batches"] == 0 and s["episodes"] == 0 and s["bytes_on_disk"] == 0
    json.dumps(s)
    assert "returns:           mean n/a" in format_summary(s)


def _age_all(root, seconds=7200.0):
    import os

    for p in [root, *root.rglob("*")]:
        st = p.stat()
        os.utime(p, (st.st_atime - seconds, st.st_mtime - seconds))


def test_a_store_is_not_created_among_other_files_and_gc_spares_them(tmp_path):
    from daskrl.testing import TagPolicy

    d = tmp_path / "shared"
    (d / "mine").mkdir(parents=True)
    users = [d / "notes.partial", d / "mine" / "results.partial",
             d / "mine" / f"zarr.{'ab' * 16}.partial", d / f"keep.{'cd' * 16}.partial.txt"]
    for f in users:
        f.write_text("the user's own")
    msg = (f"cannot create a store at 'file://{d}': it already holds other things ('keep.{'cd' * 16}"
           ".partial.txt', 'mine', 'notes.partial') and no daskrl store. Use a new or empty "
           "directory, or, to create the store there on purpose, TrajectoryStore(url, "
           "read_only=False).initialize(allow_non_empty=True) first.")
    with pytest.raises(daskrl.StoreError, match=re.escape(msg)):
        TrajectoryStore(str(d), read_only=False).initialize()
    with pytest.raises(daskrl.StoreError, match=re.escape(msg)):  # before any cluster starts
        daskrl.Collector("daskrl.testing:Counting-v0", TagPolicy(), str(d))
    assert sorted(p.name for p in d.iterdir()) == sorted(["mine", "notes.partial", users[3].name])

    TrajectoryStore(str(d), read_only=False).initialize(allow_non_empty=True)  # on purpose
    _write(str(d), 2)
    own = d / "commits" / "000000000007" / f"zarr.{'ef' * 16}.partial"
    own.parent.mkdir()
    own.write_text("{}")
    _age_all(d)
    report = daskrl.open_store(str(d), writable=True).collect_garbage(older_than=0)
    assert report.partial_files == ("commits/000000000007/zarr." + "ef" * 16 + ".partial",)
    assert not own.exists() and all(f.read_text() == "the user's own" for f in users)
    out = daskrl_main("gc", str(d), "--older-than", "0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("removed 0 uncommitted attempts and 0 partial files")
    assert all(f.read_text() == "the user's own" for f in users)
    assert len(daskrl.open_store(str(d))) == 2


def test_a_failed_start_uses_up_no_run_number(client, tmp_path):
    from daskrl.testing import TagPolicy

    url = str(tmp_path / "s")
    with pytest.raises(daskrl.UsageError, match=re.escape("client must be a distributed.Client or None")):
        daskrl.Collector("daskrl.testing:Counting-v0", TagPolicy(), url, client="tcp://x:1")
    assert daskrl.open_store(url).runs() == {}
    # A store the workers cannot see fails at the probe, after the cluster work: no run either.
    shared = "memory://daskrl-lifecycle-not-shared"
    with pytest.raises(daskrl.StoreError, match="does not see the store"):
        daskrl.Collector("daskrl.testing:Counting-v0", TagPolicy(), shared, client=client)
    store = daskrl.open_store(shared)
    assert store.runs() == {} and store.backend.list_dir("runs") == ["zarr.json"]  # no probes
    with daskrl.Collector("daskrl.testing:Counting-v0", TagPolicy(), url, client=client,
                          envs_per_worker=2, frames_per_batch=4, total_frames=8) as c:
        assert c.run_number == 0 and [h.batch_id for h in c] == [0, 1]
    assert list(daskrl.open_store(url).runs()) == [0]


def test_the_run_limit_of_a_store_is_named(tmp_path):
    from daskrl.testing import TagPolicy

    url = str(tmp_path / "s")
    w = TrajectoryStore(url, read_only=False)
    w.initialize()
    assert w.register_run({}) == 0
    (tmp_path / "s" / "runs" / "0000").rename(tmp_path / "s" / "runs" / "66085")
    msg = (f"store 'file://{tmp_path}/s' has used all 66_086 run numbers a store can have (its "
           "newest run is 66085; each run's batch and episode ids must fit 64 bits). Collect "
           "into a new store; this one stays readable.")
    with pytest.raises(daskrl.StoreError, match=re.escape(msg)):
        w.register_run({})
    with pytest.raises(daskrl.StoreError, match=re.escape(msg)):  # before any cluster starts
        daskrl.Collector("daskrl.testing:Counting-v0", TagPolicy(), url)
