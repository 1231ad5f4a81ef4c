"""A store may come from anywhere: crafted chunk headers, record paths that lead elsewhere,
symbolic links, FIFOs and devices, and damaged records are refused with a DaskrlError naming
what is wrong, in this process; a broken store never breaks the reader's other batches.  Every
store here is real, on disk, written by daskrl's writer and then damaged or crafted the way a
hostile or broken store would be.  What must be read in a child process (a crash, an unbounded
allocation under a memory limit) is in tests/test_hostile_store.py."""

from __future__ import annotations

import json
import os
import re
import struct
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hostile_stores import blosc_frame as _blosc
from hostile_stores import crafted_store as _crafted
from hostile_stores import read_members as _members
from hostile_stores import write_members as _rewrite
from hostile_stores import written_store as _store
from sample_batches import sample_arrays as _arrays
from sample_batches import sample_meta as _meta

import daskrl
import daskrl.data
from daskrl import BatchDataMissingError, StoreError, StoreFormatError, StoreRecordWarning
from daskrl._checksums import crc32c
from daskrl.cli import main as cli_main
from daskrl.data._inspect import summarize
from daskrl.store import TrajectoryStore


# -- 4: codec headers -------------------------------------------------------------------------
@pytest.mark.parametrize(("frame", "problem"), [
    (lambda n: _blosc(n, n, 16 + n, memcpyed=True, typesize=3, body=b"\0" * n),
     "blosc header declares typesize 3"),
    (lambda n: _blosc(n, 2 * n, 16 + n, memcpyed=True, body=b"\0" * n),
     f"blosc header declares blocks of {2 * 4096 * 16} bytes"),
    (lambda n: _blosc(n, 0, 16 + n, memcpyed=True, body=b"\0" * n),
     "blosc header declares blocks of 0 bytes"),
    (lambda n: _blosc(n, n, 20, memcpyed=False, body=struct.pack("<I", 1 << 20)),
     "blosc block offsets lie outside the frame"),
    (lambda n: _blosc(n, 1, 16 + 8, memcpyed=False, body=b"\0" * 8),
     f"cannot hold the offsets of its {4096 * 16} blocks"),
    (lambda n: _blosc(n - 1, n, 16 + n, memcpyed=True, body=b"\0" * n),
     f"blosc header declares {4096 * 16 - 1} bytes, expected {4096 * 16}"),
    (lambda n: _blosc(n, n, 15 + n, memcpyed=True, body=b"\0" * (n - 1)),
     f"uncompressed blosc frame holds {15 + 4096 * 16} bytes"),
    (lambda n: bytes([3]) + _blosc(n, n, 16 + n, memcpyed=True, body=b"\0" * n)[1:-4],
     "format version 3"),
])
def test_every_blosc_header_field_is_checked_against_the_chunk(tmp_path, frame, problem):
    n = 4096 * 16
    chunk = frame(n)
    if chunk[0] == 3:  # re-checksum the frame whose version byte was changed
        chunk = chunk + crc32c(chunk).to_bytes(4, "little")
    url = _crafted(tmp_path, chunk)
    with pytest.raises(StoreError, match=re.escape(problem)):
        daskrl.open_store(url).load(0)


def test_an_honest_uncompressed_blosc_frame_still_reads(tmp_path):
    n = 4096 * 16
    data = np.arange(n, dtype=np.uint64).astype(np.uint8).tobytes()
    url = _crafted(tmp_path, _blosc(n, n, n + 16, memcpyed=True, body=data))
    got = daskrl.open_store(url).load(0)["blob"].numpy()
    assert got.tobytes() == data


def test_zstd_and_gzip_frames_that_lie_about_their_size_are_refused(tmp_path):
    import gzip

    import numcodecs

    url, root, paths = _store(tmp_path, n=1, compression="zstd")
    zpath = root / paths[0]
    members = _members(zpath)
    doc = json.loads(members["reward/zarr.json"])
    # the writer picks each array's codec by what it gains: make this one plain zstd
    doc["codecs"] = [doc["codecs"][0], {"name": "zstd", "configuration": {"level": 1}},
                     {"name": "crc32c"}]
    members["reward/zarr.json"] = json.dumps(doc).encode()
    good = np.arange(12, dtype=np.float32)
    # a frame declaring the chunk's 48 bytes but holding 4 KiB of content
    frame = bytearray(numcodecs.Zstd().encode(np.zeros(1024, np.float32)))
    lying = numcodecs.Zstd().encode(good)
    for chunk in (bytes(frame), lying[:-3]):  # declares more than the chunk; truncated
        members["reward/c/0/0"] = chunk + crc32c(chunk).to_bytes(4, "little")
        _rewrite(zpath, members)
        with pytest.raises(StoreError, match=re.escape("chunk 'reward/c/0/0'")):
            daskrl.open_store(url).load(0)
    doc["codecs"][1] = {"name": "gzip", "configuration": {"level": 1}}
    members["reward/zarr.json"] = json.dumps(doc).encode()
    bomb = gzip.compress(b"\0" * (16 << 20))
    members["reward/c/0/0"] = bomb + crc32c(bomb).to_bytes(4, "little")
    _rewrite(zpath, members)
    with pytest.raises(StoreError, match=re.escape("gzip stream does not decode to exactly 48")):
        daskrl.open_store(url).load(0)


# -- 5: paths from records ----------------------------------------------------------------------
def _set_record(root: Path, bid: int, **changes) -> None:
    key = root / "commits" / f"{bid:012d}" / "zarr.json"
    doc = json.loads(key.read_text())
    doc["attributes"].update(changes)
    key.unlink()
    key.write_text(json.dumps(doc))


@pytest.mark.parametrize("kind", ["relative", "absolute", "other batch", "dot segments",
                                  "outside batches"])
def test_a_record_path_that_is_not_its_own_attempt_is_refused(tmp_path, kind):
    url, root, paths = _store(tmp_path, n=2)
    _, other_root, other_paths = _store(tmp_path, n=1, name="other")
    (root / "secret.zip").write_bytes((other_root / other_paths[0]).read_bytes())
    path = {"relative": f"../other/{other_paths[0]}",
            "absolute": str(other_root / other_paths[0]),
            "other batch": paths[0],  # batch 1's record names batch 0's container
            "dot segments": f"batches/../batches/{paths[1][8:]}",
            "outside batches": "secret.zip"}[kind]
    _set_record(root, 1, path=path)
    store = daskrl.open_store(url)
    with pytest.warns(StoreRecordWarning, match=re.escape("skipped 1 unreadable commit record")):
        assert store.batch_ids() == [0]
    with pytest.raises(StoreFormatError, match=re.escape(f"path {path!r} is not an attempt of "
                                                         "this batch")):
        store.load(1)
    assert list(store.skipped_records()) == ["commits/000000000001/zarr.json"]
    assert store.load(0)["reward"].shape == (6, 2)  # the good batch still reads
    # a handle (built by anyone) with such a path is refused too
    h = daskrl.BatchHandle(url, 1, 12, 0, 0, "w", "cpu", (), (), path)
    with pytest.raises(StoreFormatError, match="is not an attempt of this batch"):
        h.load()


def test_a_container_replaced_by_a_symlink_to_a_file_outside_is_not_followed(tmp_path):
    url, root, paths = _store(tmp_path, n=1)
    _, other_root, other_paths = _store(tmp_path, n=1, name="other",
                                        arrays=_arrays(seed=99))
    (root / paths[0]).unlink()
    (root / paths[0]).symlink_to(other_root / other_paths[0])
    with pytest.raises(StoreFormatError, match=re.escape(f"{paths[0]!r} in the store is a "
                                                         "symbolic link")):
        daskrl.open_store(url).load(0)


def test_a_batches_directory_that_links_out_of_the_store_is_not_followed(tmp_path):
    url, root, _ = _store(tmp_path, n=1)
    elsewhere = tmp_path / "elsewhere"
    (root / "batches").rename(elsewhere)
    (root / "batches").symlink_to(elsewhere)
    with pytest.raises(StoreFormatError, match=re.escape("'batches' in the store is a symbolic "
                                                         "link")):
        daskrl.open_store(url).load(0)


def test_a_fifo_in_place_of_a_container_is_refused_not_waited_on(tmp_path):
    url, root, paths = _store(tmp_path, n=2)
    (root / paths[0]).unlink()
    os.mkfifo(root / paths[0])
    store = daskrl.open_store(url)
    with pytest.raises(StoreFormatError, match=re.escape(f"{paths[0]!r} in the store is a FIFO, "
                                                         "not a regular file")):
        store.load(0)
    assert store.load(1)["reward"].shape == (6, 2)


@pytest.mark.timeout(60)
def test_a_fifo_in_place_of_a_commit_record_is_skipped_not_waited_on(tmp_path):
    url, root, _ = _store(tmp_path, n=2)
    rec = root / "commits" / "000000000001" / "zarr.json"
    rec.unlink()
    os.mkfifo(rec)
    store = daskrl.open_store(url)
    with pytest.warns(StoreRecordWarning, match="is a FIFO"):
        assert len(store) == 1
    with pytest.raises(StoreFormatError, match="is a FIFO"):
        store.load(1)


def test_a_huge_or_device_document_is_refused_before_it_is_read(tmp_path):
    url, root, _ = _store(tmp_path, n=1)
    rec = root / "commits" / "000000000000" / "zarr.json"
    rec.unlink()
    with open(rec, "wb") as f:  # 16 GiB, sparse: reading it whole would exhaust memory
        f.truncate(16 << 30)
    store = daskrl.open_store(url)
    with pytest.warns(StoreRecordWarning, match=re.escape(f"holds {16 << 30} bytes; a document "
                                                          "holds at most 1048576")):
        assert store.batch_ids() == []
    if os.geteuid() != 0:
        pytest.skip("creating a device node needs root")
    rec.unlink()
    os.mknod(rec, 0o600 | 0o020000, os.makedev(1, 5))  # a character device: /dev/zero
    store = daskrl.open_store(url)
    with pytest.warns(StoreRecordWarning, match="is a character device, not a regular file"):
        assert store.batch_ids() == []


# -- 7: one bad document does not break the store --------------------------------------------
_BAD_RECORDS = {
    "garbage": b"\x89PNG\r\n\x1a\n\0\0garbage",
    "empty": b"",
    "truncated": b'{"zarr_format": 3, "node_type": "group", "attributes": {"batch_id": 1, "pa',
    "a list": b"[1, 2, 3]",
    "attributes a string": b'{"zarr_format": 3, "node_type": "group", "attributes": "x"}',
    "no attributes": b'{"zarr_format": 3, "node_type": "group"}',
    "frames a string": None,
    "shape wrong": None,
    "batch_id of another": None,
    "deeply nested": b"[" * 100_000 + b"]" * 100_000,
}


def _damage_record(root: Path, bid: int, kind: str) -> None:
    key = root / "commits" / f"{bid:012d}" / "zarr.json"
    raw = _BAD_RECORDS[kind]
    if raw is None:
        doc = json.loads(key.read_text())
        doc["attributes"].update({"frames a string": {"frames": "12"},
                                  "shape wrong": {"shape": [6, "two"]},
                                  "batch_id of another": {"batch_id": 0}}[kind])
        raw = json.dumps(doc).encode()
    key.unlink()
    key.write_bytes(raw)


@pytest.mark.parametrize("kind", list(_BAD_RECORDS))
def test_one_bad_commit_record_is_skipped_and_reported(tmp_path, kind, capsys):
    url, root, _ = _store(tmp_path, n=3, compression="zstd")
    _damage_record(root, 1, kind)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = daskrl.open_store(url)
        assert store.batch_ids() == [0, 2] and len(store) == 2 and store.frames == 24
        assert [h.batch_id for h in store.handles()] == [0, 2]
        assert sorted(b for b, _ in ((h.batch_id, d) for h, d in store.iter_batches())) == [0, 2]
        assert daskrl.data.to_dask(store, ["reward"])["reward"].shape == (24,)
        assert len(daskrl.TransitionDataset(store)) == 24
        s = summarize(store)
        assert s["batches"] == 2 and s["skipped_records"] == 1
    assert any(issubclass(w.category, StoreRecordWarning)
               and "commits/000000000001/zarr.json" in str(w.message) for w in caught)
    with pytest.raises(StoreFormatError, match=re.escape("commit record 'commits/000000000001/"
                                                         "zarr.json' of store")):
        store.load(1)
    assert set(store.skipped_records()) == {"commits/000000000001/zarr.json"}
    assert store.load(2)["reward"].shape == (6, 2)
    with pytest.warns(StoreRecordWarning, match=re.escape("commits/000000000001/zarr.json")):
        assert cli_main(["inspect", url]) == 0
    assert "unreadable:        1 records skipped" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["garbage", "empty", "a list", "attributes a string"])
def test_one_bad_run_record_is_skipped_and_reported(tmp_path, kind):
    url, root, _ = _store(tmp_path, n=1)
    w = TrajectoryStore(url, read_only=False)
    w.register_run({"reset_at_each_iter": False})
    w.register_run({})
    rec = root / "runs" / "0000" / "zarr.json"
    rec.unlink()
    rec.write_bytes(_BAD_RECORDS[kind])
    store = daskrl.open_store(url)
    with pytest.warns(StoreRecordWarning, match=re.escape("runs/0000/zarr.json")):
        assert list(store.runs()) == [1]
    assert "runs/0000/zarr.json" in store.skipped_records()
    assert summarize(store)["runs"] == 1


@pytest.mark.parametrize("kind", ["garbage", "empty", "truncated", "a list",
                                  "attributes a string"])
def test_a_bad_root_record_is_a_store_format_error_naming_it(tmp_path, kind, capsys):
    url, root, _ = _store(tmp_path, n=1)
    (root / "zarr.json").unlink()
    (root / "zarr.json").write_bytes(_BAD_RECORDS[kind])
    with pytest.raises(StoreFormatError, match=re.escape("'zarr.json' of store")
                       + "|" + re.escape("is a zarr hierarchy but not a daskrl store")):
        daskrl.open_store(url)
    assert cli_main(["inspect", url]) == 1  # a runtime error: the store is damaged
    err = capsys.readouterr().err
    assert err.startswith("daskrl: error: ") and "Traceback" not in err


# -- 8: readers that give up, and say why ------------------------------------------------------
def _episode_arrays(seed: int) -> dict[str, np.ndarray]:
    a = _arrays(seed=seed)
    T, E = a["reward"].shape
    a["episode_id"] = np.broadcast_to(np.arange(E), (T, E)).astype(np.int64) + seed * (1 << 24)
    a["truncated"] = np.zeros((T, E), bool)
    a["terminated"] = np.zeros((T, E), bool)
    a["terminated"][-1] = True
    a["step"] = np.broadcast_to(np.arange(T)[:, None], (T, E)).astype(np.int64)
    return a


@pytest.mark.timeout(60)
def test_a_replay_dataset_over_missing_containers_raises_instead_of_spinning(tmp_path):
    url, root, paths = _store(tmp_path, n=2)
    for p in paths:
        (root / p).unlink()
    ds = daskrl.ReplayDataset(url, wait_seconds=1.0, num_samples=10)
    with pytest.warns(StoreRecordWarning, match="ReplayDataset skips batch"), \
            pytest.raises(StoreError, match=re.escape("2 committed batch(es) [0, 1] cannot be "
                                                      "read")):
        list(ds)


def test_a_replay_dataset_skips_a_damaged_batch_and_samples_the_others(tmp_path):
    url, root, paths = _store(tmp_path, n=3)
    (root / paths[1]).unlink()
    ds = daskrl.ReplayDataset(url, keys=["reward"], wait_seconds=5.0, num_samples=300,
                              samples_per_batch=10)
    with pytest.warns(StoreRecordWarning, match="ReplayDataset skips batch 1"):
        samples = list(ds)
    assert len(samples) == 300
    good = np.concatenate([_arrays(seed=b)["reward"].ravel() for b in (0, 2)])
    assert np.isin([float(s["reward"]) for s in samples], good).all()


def test_iter_batches_and_episodes_report_missing_data_instead_of_yielding_nothing(tmp_path):
    url, root, paths = _store(tmp_path, n=2, arrays=None)
    w = TrajectoryStore(url, read_only=False)
    for b in (0, 1):  # replace with batches that hold episodes
        w.delete_batches([b])
    paths = [w.write_batch(b, _episode_arrays(b), _meta(), compression="zstd")[0] for b in (5, 6)]
    store = daskrl.open_store(url)
    assert len(list(daskrl.data.episodes(store))) == 4
    for p in paths:
        (root / p).unlink()
    with pytest.raises(BatchDataMissingError, match=re.escape("batch 5 (")):
        next(store.iter_batches())
    with pytest.raises(BatchDataMissingError, match="is committed but its data is missing"):
        list(daskrl.data.episodes(store))



@pytest.mark.parametrize("keys", [None, ["reward"]])
def test_episodes_of_batches_without_episode_arrays_are_a_store_format_error(tmp_path, keys):
    # A store with a damaged run record (garbage in its settings) and batches that hold no
    # episode_id, step, terminated or truncated (written outside a collector).
    url, root, _ = _store(tmp_path, n=2)
    TrajectoryStore(url, read_only=False).register_run({"reset_at_each_iter": False})
    rec = root / "runs" / "0000" / "zarr.json"
    rec.write_bytes(rec.read_bytes().replace(b'{"reset_at_each_iter": false}', b'"\x00#!"'))
    store = daskrl.open_store(url)
    with pytest.warns(StoreRecordWarning, match=re.escape("runs/0000/zarr.json")), \
            pytest.raises(StoreFormatError, match=re.escape(
                "batch 0 of store") + ".*" + re.escape(
                "has no ['episode_id', 'truncated', 'step'] array(s), which episodes are "
                "reassembled from")):
        next(daskrl.data.episodes(store, keys))
    assert store.load(0)["reward"].shape == (6, 2)  # the batch itself still reads


def test_a_run_record_with_garbage_settings_is_skipped_and_episodes_stay_whole(tmp_path):
    # Two envs, whose episodes of 6 steps span batches 0 and 1 of run 0.
    url, root, _ = _store(tmp_path, n=0)
    w = TrajectoryStore(url, read_only=False)
    w.register_run({"reset_at_each_iter": False})
    for b in (0, 1):
        a = _arrays(T=3, seed=b)
        a["episode_id"] = np.broadcast_to(np.arange(2), (3, 2)).astype(np.int64)
        a["step"] = np.broadcast_to(np.arange(3 * b, 3 * b + 3)[:, None], (3, 2)).astype(np.int64)
        a["terminated"] = np.zeros((3, 2), bool)
        a["terminated"][-1] = b == 1
        a["truncated"] = np.zeros((3, 2), bool)
        w.write_batch(b, a, _meta(3, 2))
    assert [e.length for e in daskrl.data.episodes(daskrl.open_store(url))] == [6, 6]
    rec = root / "runs" / "0000" / "zarr.json"
    rec.write_bytes(rec.read_bytes().replace(b'"reset_at_each_iter": false',
                                             b'"reset_at_each_iter": "g4rb@ge#!"'))
    store = daskrl.open_store(url)
    with pytest.warns(StoreRecordWarning, match=re.escape(
            "field(s) ['settings.reset_at_each_iter'] have the wrong type")):
        episodes = list(daskrl.data.episodes(store))
    assert [(e.length, e.complete) for e in episodes] == [(6, True), (6, True)]
    assert "runs/0000/zarr.json" in store.skipped_records()

class _PruningStore(TrajectoryStore):
    """A reader in whose listing another process's ``keep_last`` lands right after it listed:
    the real deletion (record, then container) of a batch it is about to read."""

    prune: TrajectoryStore | None = None

    def records(self):
        recs = super().records()
        if self.prune is not None:
            self.prune.keep_last(2)
            self.prune = None
        return recs


def test_summary_and_to_dask_skip_a_batch_pruned_during_the_read(tmp_path, capsys):
    url, root, paths = _store(tmp_path, n=3, compression="zstd")
    reader = _PruningStore(url)
    reader.prune = TrajectoryStore(url, read_only=False)
    s = summarize(reader)
    assert s["batches"] == 2 and s["frames"] == 24
    assert not (root / paths[0]).exists()
    w = TrajectoryStore(url, read_only=False)
    w.write_batch(3, _arrays(seed=3), _meta(), compression="zstd")
    reader.prune = TrajectoryStore(url, read_only=False)
    view = daskrl.data.to_dask(reader, ["reward"], batch_ids=[1, 2, 3])
    assert view["reward"].shape == (24,)
    np.testing.assert_array_equal(
        view["reward"].compute(),
        np.concatenate([_arrays(seed=b)["reward"].ravel() for b in (2, 3)]))
    # a batch whose record stays but whose data went is damage, not a pruning: it raises
    (root / w.records()[3]["path"]).unlink()
    with pytest.raises(BatchDataMissingError, match=re.escape("batch 3 (")):
        summarize(daskrl.open_store(url))
    with pytest.raises(BatchDataMissingError, match=re.escape("batch 3 (")):
        daskrl.data.to_dask(daskrl.open_store(url), ["reward"])



class _PrunedAfterItsFirstListing(TrajectoryStore):
    """A reader whose first listing (of ids or of records) another process's ``keep_last``
    follows at once: the real deletion (record, then container) of a batch just listed."""

    prune: TrajectoryStore | None = None

    def _then_prune(self, listed):
        if self.prune is not None:
            self.prune.keep_last(2)
            self.prune = None
        return listed

    def batch_ids(self):
        return self._then_prune(super().batch_ids())

    def records(self):
        return self._then_prune(super().records())


def test_to_dask_leaves_out_a_batch_pruned_right_after_it_listed_the_store(tmp_path):
    url, root, paths = _store(tmp_path, n=3, compression="zstd")
    reader = _PrunedAfterItsFirstListing(url)
    reader.prune = TrajectoryStore(url, read_only=False)
    view = daskrl.data.to_dask(reader, ["reward"])["reward"]
    assert not (root / paths[0]).exists() and reader.batch_ids() == [1, 2]
    assert view.shape == (24,)
    np.testing.assert_array_equal(
        view.compute(), np.concatenate([_arrays(seed=b)["reward"].ravel() for b in (1, 2)]))
    # A batch asked for by id that is not committed is an error, as before.
    with pytest.raises(daskrl.BatchNotFoundError, match=re.escape("no committed batches [0]")):
        daskrl.data.to_dask(reader, ["reward"], batch_ids=[0, 1])


def test_a_batch_pruned_after_its_dask_view_was_built_says_to_build_it_again(tmp_path):
    url, _, _ = _store(tmp_path, n=3, compression="zstd")
    view = daskrl.data.to_dask(daskrl.open_store(url), ["reward"])["reward"]
    TrajectoryStore(url, read_only=False).keep_last(2)
    with pytest.raises(daskrl.BatchNotFoundError,
                       match=re.escape("batch 0 was deleted after this dask view was built")):
        view.compute()
    again = daskrl.data.to_dask(daskrl.open_store(url), ["reward"])["reward"]
    assert again.shape == (24,) and again.compute().shape == (24,)

# -- 9: the local header's CRC-32 -------------------------------------------------------------
def test_a_local_header_whose_crc32_disagrees_with_the_directory_is_refused(tmp_path):
    url, root, paths = _store(tmp_path, n=1, compression="none")
    zpath = root / paths[0]
    with zipfile.ZipFile(zpath) as z:
        info = z.getinfo("reward/c/0/0")
    raw = bytearray(zpath.read_bytes())
    (crc,) = struct.unpack_from("<I", raw, info.header_offset + 14)
    struct.pack_into("<I", raw, info.header_offset + 14, crc ^ 0x1)  # the local copy only
    zpath.write_bytes(bytes(raw))
    with pytest.raises(StoreError, match=re.escape("local header disagrees with the central "
                                                   "directory")):
        daskrl.open_store(url).load(0)


def test_a_repaired_commit_record_is_listed_again(tmp_path):
    url, root, _ = _store(tmp_path, n=2)
    rec = root / "commits" / "000000000001" / "zarr.json"
    good = rec.read_bytes()
    rec.unlink()
    rec.write_bytes(b"{")
    store = daskrl.open_store(url)
    with pytest.warns(StoreRecordWarning):
        assert store.batch_ids() == [0]
    assert store.batch_ids() == [0]  # reported once, not on every listing
    rec.unlink()
    rec.write_bytes(good)
    assert store.batch_ids() == [0, 1] and store.skipped_records() == {}
    assert store.load(1)["reward"].shape == (6, 2)


@pytest.mark.parametrize("kind", ["garbage", "a list", "batch_id of another"])
def test_a_damaged_commit_record_can_be_deleted_and_gc_survives_it(tmp_path, kind):
    """Housekeeping reads records too: a damaged one is deleted on request, and garbage
    collection neither fails on it nor collects the container it might name."""
    url, root, paths = _store(tmp_path, n=3)
    _damage_record(root, 1, kind)
    w = TrajectoryStore(url, read_only=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StoreRecordWarning)
        report = w.collect_garbage(older_than=0)
        assert (root / paths[1]).is_file()  # a damaged record may name it: kept
        assert report.attempts == ()
        assert w.delete_batches([1]) == [1]
        assert not (root / "commits" / f"{1:012d}").exists()
        w.refresh()
        assert w.batch_ids() == [0, 2] and not w.skipped_records()
        w.collect_garbage(older_than=0)  # now named by no record: its container is garbage
        assert not (root / paths[1]).exists()
        assert w.load(2)["reward"].shape == (6, 2)
