"""Batch containers (store format 2.x): the zip writer against Python's zipfile and zarr's
ZipStore, and the reader's refusal of every container it did not write."""

from __future__ import annotations

import asyncio
import json
import re
import struct
import zipfile

import numpy as np
import pytest
import zarr
import zarr.codecs
from sample_batches import sample_arrays as _arrays
from sample_batches import sample_meta as _meta
from zarr.core.buffer import default_buffer_prototype
from zarr.storage import MemoryStore, ZipStore

import daskrl
from daskrl import StoreFormatError
from daskrl.config import Compression
from daskrl.errors import ArrayNotFoundError, UnsupportedDtypeError
from daskrl.store import ReadLimits, TrajectoryStore
from daskrl.store._format import (
    BytesSource,
    FileSource,
    encode_batch,
    read_batch,
    read_index,
    zip_container,
    zip_read,
    zip_write,
)


def _write(tmp_path, arrays=None, compression="none"):
    url = str(tmp_path / "s")
    w = TrajectoryStore(url, read_only=False)
    w.initialize()
    arrays = arrays if arrays is not None else _arrays()
    T, E = next(iter(arrays.values())).shape[:2]
    path, _ = w.write_batch(0, arrays, _meta(T, E), compression=compression)
    return url, tmp_path / "s" / path, path


@pytest.mark.parametrize("compression", ["none", "zstd", "lz4"])
def test_members_are_byte_identical_to_zarr_python(tmp_path, compression):
    """The zip's members are exactly the files zarr-python writes for the same arrays (several
    chunks, a padded edge chunk); zipfile, zarr's ZipStore and daskrl's reader read it."""
    from daskrl.store._format import encode as zarr_encode

    rng = np.random.default_rng(2)
    arrays = {"observation": rng.standard_normal((37, 5, 10)).astype(np.float32),
              "action": rng.integers(0, 4, (37, 5)).astype(np.int64),
              "done": rng.random((37, 5)) < 0.1}
    path = "batches/000000000000-0123456789ab.zip"
    batch = encode_batch({**_meta(37, 5), "batch_id": 0, "path": path}, arrays,
                         Compression(compression), chunk_bytes=4096)
    zpath = tmp_path / "b.zip"
    zpath.write_bytes(b"".join(bytes(memoryview(p).cast("B")) for p in batch.parts()))
    comp = {"zstd": [zarr.codecs.ZstdCodec(level=1)], "none": []}
    ref_store = MemoryStore()
    for name, a in arrays.items():
        c = comp.get(compression) or ([zarr.codecs.BloscCodec(
            cname="lz4", clevel=1, shuffle="shuffle", typesize=a.dtype.itemsize)]
            if compression == "lz4" else [])
        ref = zarr.create_array(ref_store, name=name, shape=a.shape, dtype=a.dtype,
                                chunks=(zarr_encode.chunk_rows(a, 4096), *a.shape[1:]),
                                compressors=[*c, zarr.codecs.Crc32cCodec()], fill_value=0,
                                dimension_names=zarr_encode.dimension_names(name, a.ndim),
                                config={"write_empty_chunks": True})
        ref[...] = a

    async def items():
        return {k: (await ref_store.get(k, default_buffer_prototype())).to_bytes()
                async for k in ref_store.list_prefix("")}

    theirs = {k: v for k, v in asyncio.run(items()).items() if k != "zarr.json"}
    with zipfile.ZipFile(zpath) as z:
        assert z.testzip() is None
        ours = {n: z.read(n) for n in z.namelist()}
    assert json.loads(ours.pop("zarr.json"))["attributes"]["path"] == path
    assert set(ours) == set(theirs) and len(ours) > 2 * len(arrays)
    for key, data in ours.items():
        if key.endswith("zarr.json"):
            assert json.loads(data) == json.loads(theirs[key]), key
        else:
            assert data == theirs[key], key
    group = zarr.open_group(ZipStore(zpath, mode="r"), mode="r")
    for name, a in arrays.items():
        np.testing.assert_array_equal(group[name][...], a)
    for src in (FileSource(tmp_path, "b.zip", "b"), BytesSource(zpath.read_bytes(), "b")):
        index = read_index(src)
        assert index.arrays == sorted(arrays) and len(index.chunks["observation"]) == 2
        got = read_batch(src, index)
        src.close()
        for name, a in arrays.items():
            np.testing.assert_array_equal(got[name], a)


def test_zero_size_large_and_unicode_members_and_zip64_records(tmp_path):
    big = np.random.default_rng(0).integers(0, 255, (5 << 20) + 3, dtype=np.uint8)
    entries = [("empty", []), ("big/c/0", [big[:100], big[100:]]), ("ünï/zarr.json", [b"{}"]),
               ("also-empty", [b""])]
    for force in (False, True):
        archive = zip_write.build_archive(entries, force_zip64=force)
        f = tmp_path / f"a{force}.zip"
        f.write_bytes(b"".join(bytes(memoryview(p).cast("B")) for p in archive.parts))
        assert archive.size == f.stat().st_size
        with zipfile.ZipFile(f) as z:
            assert z.testzip() is None
            assert z.namelist() == [n for n, _ in entries]
            assert z.read("big/c/0") == big.tobytes() and z.read("empty") == b""
            assert z.read("ünï/zarr.json") == b"{}"
        data = f.read_bytes()
        d = zip_read.find_directory(data[-4096:], len(data) - 4096, len(data))
        members, crcs = zip_read.parse_directory(data[d.offset:d.offset + d.size], d)
        by_name = {m.name: m for m in members}
        m = by_name["big/c/0"]
        assert data[m.data_offset:m.end] == big.tobytes() and crcs[m.name] == archive.crcs[1]
        assert by_name["empty"].size == 0
        assert (b"PK\x06\x06" in data[-200:]) == force  # ZIP64 end record only when asked


def test_more_than_65535_members_use_zip64_end_records(tmp_path):
    n = 70_000
    archive = zip_write.build_archive([(f"m{i}", []) for i in range(n)])
    f = tmp_path / "many.zip"
    f.write_bytes(b"".join(archive.parts))
    with zipfile.ZipFile(f) as z:
        assert len(z.infolist()) == n and z.infolist()[-1].filename == f"m{n - 1}"
    data = f.read_bytes()
    d = zip_read.find_directory(data[-100:], len(data) - 100, len(data))
    assert d.count == n
    members, _ = zip_read.parse_directory(data[d.offset:d.offset + d.size], d)
    assert len(members) == n


def test_crc32_is_zips_whatever_implementation_computes_it():
    import zlib

    data = np.random.default_rng(1).integers(0, 255, (1 << 20) + 7, dtype=np.uint8)
    parts = [data[:5], memoryview(data[5:1000]), bytes(data[1000:]), bytearray(b"")]
    assert zip_container.crc32(parts) == zlib.crc32(data.tobytes())
    assert zip_container.crc32_update(data[9:], zip_container.crc32_update(data[:9])) == zlib.crc32(data)


def test_the_writer_refuses_what_it_cannot_write():
    with pytest.raises(zip_container.ZipFormatError, match=re.escape("member name '../x' is not a relative POSIX path")):
        zip_write.build_archive([("../x", [b""])])
    with pytest.raises(zip_container.ZipFormatError, match=re.escape("member name 'a' occurs twice")):
        zip_write.build_archive([("a", [b""]), ("a", [b""])])


# -- the reader refuses containers it did not write --------------------------------------------
def _central(data: bytes):
    """``{name: offset of its central directory entry}``."""
    cd_size, cd_offset = struct.unpack_from("<II", data, len(data) - 22 + 12)
    out, pos = {}, cd_offset
    while pos < cd_offset + cd_size:
        nlen, xlen, clen = struct.unpack_from("<HHH", data, pos + 28)
        out[data[pos + 46:pos + 46 + nlen].decode()] = pos
        pos += 46 + nlen + xlen + clen
    return out


def _patch(zpath, name, field_offset, fmt, value):
    data = bytearray(zpath.read_bytes())
    struct.pack_into(fmt, data, _central(bytes(data))[name] + field_offset, value)
    zpath.write_bytes(bytes(data))


def _rewrite(zpath, members: dict, compression=zipfile.ZIP_STORED):
    zpath.unlink()
    with zipfile.ZipFile(zpath, "w", compression=compression) as z:
        for name, data in members.items():
            z.writestr(name, data)


def _members(zpath):
    with zipfile.ZipFile(zpath) as z:
        return {n: z.read(n) for n in z.namelist()}


def _refused(url, path, problem):
    with pytest.raises(StoreFormatError, match=re.escape(f"batch 0 ({path!r})") + ".*"
                       + re.escape(problem)):
        daskrl.open_store(url).load(0)


@pytest.mark.parametrize(("tamper", "problem"), [
    (lambda z: _patch(z, "reward/zarr.json", 8, "<H", 0x0001),
     "member b'reward/zarr.json' has flags 0x0001 (encrypted"),
    (lambda z: _patch(z, "observation/c/0/0/0", 8, "<H", 0x0008),
     "member b'observation/c/0/0/0' has flags 0x0008 (encrypted, a data descriptor"),
    (lambda z: _rewrite(z, _members(z), zipfile.ZIP_DEFLATED),
     "member b'observation/c/0/0/0' is compressed (method 8)"),
    (lambda z: _rewrite(z, {**_members(z), "../escape": b"x"}),
     "member name '../escape' is not a relative POSIX path"),
    (lambda z: _rewrite(z, {**_members(z), "/abs/zarr.json": b"x"}),
     "member name '/abs/zarr.json' is not a relative POSIX path"),
    (lambda z: _rewrite(z, {**_members(z), "notes.txt": b"x"}),
     "unexpected zip member 'notes.txt'"),
    (lambda z: _rewrite(z, {**_members(z), "reward/c/7/0": b"x"}),
     "zip members ['reward/c/7/0'] are not chunks of its grid"),
    (lambda z: _rewrite(z, {**_members(z), "ghost/c/0/0": b"x"}),
     "zip members ['c/0/0'] of array 'ghost' have no zarr.json"),
    (lambda z: _patch(z, "reward/c/0/0", 42, "<I", 0),
     "overlaps the member before it"),
    (lambda z: _patch(z, "zarr.json", 42, "<I", 1 << 30),
     "past the start of the central directory"),
    (lambda z: _patch(z, "zarr.json", 20, "<I", 1 << 30),
     "sizes 1073741824 != "),
    (lambda z: z.write_bytes(z.read_bytes() + b"trailing"),
     "no end of central directory record in the last 22 bytes"),
    (lambda z: z.write_bytes(b"junk" + z.read_bytes()),
     "the end records describe an archive of"),
    (lambda z: z.write_bytes(z.read_bytes()[:-30]),
     "no end of central directory record"),
])
def test_the_reader_refuses_unexpected_containers(tmp_path, tamper, problem):
    url, zpath, path = _write(tmp_path)
    tamper(zpath)
    _refused(url, path, problem)


def test_zipfile_written_containers_are_read_and_docs_checked(tmp_path):
    """A container rewritten by zipfile (other header fields, same members) still reads; a
    tampered document in it is refused by the allowlist; a flipped data byte is detected."""
    url, zpath, path = _write(tmp_path)
    members = _members(zpath)
    _rewrite(zpath, members)
    got = daskrl.open_store(url).load(0)
    for k, v in _arrays().items():
        np.testing.assert_array_equal(got[k].numpy(), v)
    doc = json.loads(members["reward/zarr.json"])
    doc["codecs"].append({"name": "numcodecs.pickle"})
    _rewrite(zpath, {**members, "reward/zarr.json": json.dumps(doc).encode()})
    _refused(url, path, "array 'reward': codec {'name': 'numcodecs.pickle'} is not allowed")
    data = bytearray(zpath.read_bytes())
    start = data.index(b"reward/zarr.json") + len("reward/zarr.json")  # its local header's name
    data[start + 10] ^= 0x01  # a byte of the document: its zip CRC-32 no longer matches
    zpath.write_bytes(bytes(data))
    with pytest.raises(StoreFormatError, match=re.escape("zip member 'reward/zarr.json' fails "
                                                         "its CRC-32")):
        daskrl.open_store(url).load(0, keys=["reward"])


def test_a_small_container_cannot_make_the_reader_allocate_without_bound(tmp_path):
    url, zpath, path = _write(tmp_path)
    members = _members(zpath)
    doc = json.loads(members["reward/zarr.json"])
    doc["shape"] = [1 << 26, 1 << 10]  # 256 GiB of float32, chunks absent: all fill
    doc["chunk_grid"]["configuration"]["chunk_shape"] = [1 << 16, 1 << 10]
    _rewrite(zpath, {k: v for k, v in members.items() if not k.startswith("reward/c")}
             | {"reward/zarr.json": json.dumps(doc).encode()})
    size = zpath.stat().st_size
    _refused(url, path, f"its arrays would decode to {(1 << 36) * 4 + 6 * 2 * 13} bytes from a "
                        f"container of {size} bytes (more than {ReadLimits().max_expansion}x; "
                        "if this store is trusted, raise it: open_store(url, "
                        "read_limits=ReadLimits(max_expansion=...))")
    assert daskrl.open_store(url).load(0, keys=["terminated"])["terminated"].shape == (6, 2)


def test_a_committed_batch_whose_container_is_missing_is_a_damaged_store(tmp_path):
    url, zpath, path = _write(tmp_path)
    zpath.unlink()
    with pytest.raises(daskrl.BatchDataMissingError,
                       match=re.escape(f"batch 0 ({path!r}) of ") + ".*"
                       + re.escape("is committed but its data is missing")) as e:
        daskrl.open_store(url).load(0)
    assert not isinstance(e.value, daskrl.BatchNotFoundError)  # not "deleted meanwhile"


def test_a_grid_of_mostly_absent_chunks_is_refused(tmp_path):
    url, zpath, path = _write(tmp_path)
    members = _members(zpath)
    doc = json.loads(members["reward/zarr.json"])
    doc["shape"] = [1 << 20, 2]  # 8 MiB: within the size bound, but a million 1-row chunks
    doc["chunk_grid"]["configuration"]["chunk_shape"] = [1, 2]
    _rewrite(zpath, members | {"reward/zarr.json": json.dumps(doc).encode()})
    _refused(url, path, f"its arrays have {(1 << 20) + 2} chunks, the container 3 chunk members")


def test_read_limits_are_options_of_the_store(tmp_path):
    """Tighter limits refuse a batch the defaults read, naming the option to raise."""
    url, zpath, _ = _write(tmp_path, {"reward": np.zeros((4000, 8), np.float32)}, "zstd")
    assert zpath.stat().st_size * 2 < 128000  # the batch decodes to more than twice its file
    tight = ReadLimits(free_bytes=1, max_expansion=2)
    with pytest.raises(StoreFormatError, match=re.escape("read_limits=ReadLimits(max_expansion=")):
        daskrl.open_store(url, read_limits=tight).load(0)
    with pytest.raises(StoreFormatError, match=re.escape("metadata documents hold at most 10 ")):
        daskrl.open_store(url, read_limits=ReadLimits(max_document_bytes=10)).load(0)
    with pytest.raises(StoreFormatError, match=re.escape("ReadLimits.max_directory_bytes")):
        daskrl.open_store(url, read_limits=ReadLimits(max_directory_bytes=100)).load(0)
    assert daskrl.open_store(url).load(0)["reward"].shape == (4000, 8)
    with pytest.raises(daskrl.ConfigError, match=re.escape("ReadLimits.max_expansion must be a positive")):
        ReadLimits(max_expansion=0)


def test_a_missing_array_is_an_array_not_found_error_listing_the_arrays(tmp_path):
    url, _, path = _write(tmp_path)
    with pytest.raises(ArrayNotFoundError, match=re.escape(
            f"batch 0 ({path!r}) has no array 'ghost'; it has "
            "['observation', 'reward', 'terminated']")) as e:
        daskrl.open_store(url).load(0, keys=["ghost"])
    assert isinstance(e.value, KeyError)


def test_an_object_array_is_an_unsupported_dtype_error(tmp_path):
    w = TrajectoryStore(str(tmp_path / "s"), read_only=False)
    w.initialize()
    arrays = {**_arrays(), "names": np.array([["a", "b"]] * 6, dtype=object)}
    with pytest.raises(UnsupportedDtypeError, match="dtype object cannot be stored"):
        w.write_batch(0, arrays, _meta())
