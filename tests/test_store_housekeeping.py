"""Deleting batches under readers, keep-last-N, and the inspect / gc / prune commands."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

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


def _cli(*args, pre=""):
    code = f"{pre}import sys; from daskrl.cli import main; sys.exit(main({list(args)!r}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)


def test_cli_inspect_gc_and_prune(tmp_path, capsys):
    url = str(tmp_path / "s")
    _write(url, 4)
    dead = tmp_path / "s" / "batches" / "000000000009-deadbeef0000"
    dead.mkdir()
    (dead / "zarr.json").write_text("{}")
    png = tmp_path / "returns.png"
    out = _cli("inspect", url, "--plot", str(png))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for line in ("batches:           4", "frames:            128",
                 "episodes:          8 ended (mean length 11.00)",
                 "returns:           mean 1.75, std 1.15, min 0.00, max 3.50, mean of last 100 1.75",
                 "weights versions:  2 (0..1)", "workers:           2", f"plot: {png}"):
        assert line in text, (line, text)
    ratio = float(re.search(r"compression ratio (\d+\.\d+)", text).group(1))
    assert ratio > 1.5  # repetitive observations compress under zstd
    assert re.search(r"bytes on disk:     \d+\.\d KiB \(chunks \d+ B of 4\.6 KiB uncompressed: compression ratio", text)
    assert "garbage:           2 B" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000

    from daskrl.summary import summarize

    summary = summarize(daskrl.open_store(url))
    assert summary["bytes_uncompressed"] == 4 * (16 * 2 * 8 * 4 + 16 * 2 * 4 + 16 * 2)

    out = _cli("gc", url, "--older-than", "0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("removed 1 uncommitted attempts and 0 partial files (2 bytes)")
    assert not dead.exists() and len(daskrl.open_store(url)) == 4

    out = _cli("inspect", url, "--plot", str(png), pre="sys = __import__('sys'); sys.modules['matplotlib'] = None; ")
    assert out.returncode == 2
    assert 'Install it with: pip install "daskrl[plot]"' in out.stderr

    from daskrl.cli import main  # the same entry point, in process

    capsys.readouterr()
    assert main(["prune", url, "--keep-last", "3"]) == 0
    assert capsys.readouterr().out.strip() == "deleted 1 batches; 3 remain"
    assert main(["inspect", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["batches"] == 3
    assert main(["inspect", str(tmp_path / "nowhere")]) == 2
    assert "daskrl: error: no daskrl store at" in capsys.readouterr().err


def test_summary_json_of_an_empty_store(tmp_path):
    url = str(tmp_path / "s")
    TrajectoryStore(url, read_only=False).initialize()
    from daskrl.summary import format_summary, summarize

    s = summarize(daskrl.open_store(url))
    assert s["batches"] == 0 and s["episodes"] == 0 and s["bytes_on_disk"] == 0
    json.dumps(s)
    assert "returns:           mean n/a" in format_summary(s)
