"""The reader's allowlist: untrusted metadata is refused before any data is read; no pickle."""

from __future__ import annotations

import json
import re
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
import zarr.codecs

import daskrl
import daskrl.data
from daskrl import StoreFormatError
from daskrl.store import TrajectoryStore
from daskrl.store._format.allowlist import ALLOWED_DATA_TYPES, check_array_metadata

sys.path.insert(0, str(Path(__file__).parent))
from sample_batches import sample_arrays as _arrays
from sample_batches import sample_meta as _meta


@pytest.fixture
def written(tmp_path):
    """``(store root, batch path)`` of one uncompressed batch."""
    w = TrajectoryStore(str(tmp_path / "s"), read_only=False)
    w.initialize()
    path, _ = w.write_batch(0, _arrays(), _meta(), compression="none")
    return tmp_path / "s", path


def _replace(root: Path, path: str, key: str, data: bytes) -> None:
    """Replace the member ``key`` of a batch's container."""
    with zipfile.ZipFile(root / path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    (root / path).unlink()
    with zipfile.ZipFile(root / path, "w") as z:  # stored, as zipfile writes it
        for name, value in (members | {key: data}).items():
            z.writestr(name, value)


def _read(root: Path, path: str, key: str) -> bytes:
    with zipfile.ZipFile(root / path) as z:
        return z.read(key)


def _tamper(root: Path, path: str, name: str, **changes):
    doc = json.loads(_read(root, path, f"{name}/zarr.json"))
    doc.update(changes)
    _replace(root, path, f"{name}/zarr.json", json.dumps(doc).encode())


@pytest.mark.parametrize(("changes", "problem"), [
    ({"data_type": "string"}, "data_type 'string' is not allowed"),
    ({"data_type": "|O"}, "data_type '|O' is not allowed"),
    ({"zarr_format": 2}, "zarr_format is 2, expected 3"),
    ({"codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                 {"name": "numcodecs.pickle"}]},
     "codec {'name': 'numcodecs.pickle'} is not allowed"),
    ({"codecs": [{"name": "sharding_indexed", "configuration": {}}]},
     "codec {'name': 'sharding_indexed', 'configuration': {}} is not allowed"),
    ({"codecs": [{"name": "transpose", "configuration": {"order": [1, 0]}},
                 {"name": "bytes", "configuration": {"endian": "little"}}]},
     "codec {'name': 'transpose', 'configuration': {'order': [1, 0]}} is not allowed"),
    ({"storage_transformers": [{"name": "x"}]}, "storage_transformers [{'name': 'x'}] are not allowed"),
    ({"my_extension": {"must_understand": True}}, "unknown metadata key 'my_extension'"),
])
def test_tampered_metadata_is_refused_naming_batch_and_array(written, changes, problem):
    root, path = written
    _tamper(root, path, "reward", **changes)
    store = daskrl.open_store(str(root))
    msg = f"batch 0 ({path!r}), array 'reward': {problem}"
    with pytest.raises(StoreFormatError, match=re.escape(msg)):
        store.load(0)
    with pytest.raises(StoreFormatError, match=re.escape(msg)):
        daskrl.data.to_dask(store, ["reward"])
    # arrays that pass are still readable on their own
    assert store.load(0, keys=["terminated"])["terminated"].dtype == torch.bool


def test_refusal_comes_before_any_data_is_read(written):
    root, path = written
    _tamper(root, path, "reward", codecs=[{"name": "bytes"}, {"name": "evil.codec"}])
    # 'observation' sorts first: were data read array by array, its corrupt chunk would fail first
    _replace(root, path, "observation/c/0/0/0", b"garbage")
    with pytest.raises(StoreFormatError, match=re.escape("array 'reward': codec")):
        daskrl.open_store(str(root)).load(0)


def test_allowlist_accepts_exactly_numeric_and_bool_types():
    assert {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
                                  "uint32", "uint64", "float16", "float32", "float64",
                                  "complex64", "complex128"} == ALLOWED_DATA_TYPES
    base = json.loads(next(iter(
        dict(daskrl.store._format.encode.encode_array("a", np.zeros((2, 1), np.float32), "zstd")).values())))
    assert check_array_metadata(base, "x").compressor == "zstd"
    for bad in ("string", "bytes", "r16", "datetime64", "numpy.datetime64", "|O", "<U4"):
        with pytest.raises(StoreFormatError, match=re.escape(f"x: data_type {bad!r} is not allowed")):
            check_array_metadata({**base, "data_type": bad}, "x")


@pytest.mark.parametrize("compressor", [
    None, zarr.codecs.GzipCodec(level=1), zarr.codecs.ZstdCodec(level=3),
    zarr.codecs.BloscCodec(cname="zstd", clevel=2, shuffle="bitshuffle", typesize=8),
])
def test_reads_what_zarr_python_writes_within_the_allowlist(tmp_path, compressor):
    """Big-endian data, chunks split along every axis, padded edges, missing (fill) chunks, in
    a zip container written by zarr's ZipStore."""
    container = True
    url = str(tmp_path / "s")
    w = TrajectoryStore(url, read_only=False)
    w.initialize()
    path = "batches/000000000005-handmade.zip"
    zstore = zarr.storage.ZipStore(tmp_path / "s" / path, mode="w")
    group = zarr.open_group(zstore, mode="w")
    rng = np.random.default_rng(1)
    data = {
        "obs": (rng.standard_normal((7, 3, 5)) * 100).astype(">f8"),
        "count": np.arange(21, dtype=">i4").reshape(7, 3),
        "flag": np.zeros((7, 3), bool),  # all fill: zarr writes no chunk at all
    }
    data["flag"][6, 2] = True
    for name, a in data.items():
        arr = group.create_array(
            name, shape=a.shape, dtype=a.dtype, chunks=(3, 2, *a.shape[2:]),
            compressors=[compressor] if compressor else None, fill_value=0,
            serializer=zarr.codecs.BytesCodec(endian="big") if a.dtype.itemsize > 1 else "auto",
        )
        arr[...] = a
    if container:
        zstore.close()
        with zipfile.ZipFile(tmp_path / "s" / path) as z:
            assert "flag/c/0/0" not in z.namelist() and "flag/c/2/1" in z.namelist()
    meta = _meta(7, 3) | {"path": path, "batch_id": 5}
    (tmp_path / "s" / "commits" / "000000000005").mkdir()
    (tmp_path / "s" / "commits" / "000000000005" / "zarr.json").write_text(
        json.dumps({"zarr_format": 3, "node_type": "group", "attributes": meta}))
    batch = daskrl.open_store(url).load(5)
    for name, a in data.items():
        np.testing.assert_array_equal(batch[name].numpy(), a.astype(a.dtype.newbyteorder("=")))


@pytest.mark.parametrize("compression", ["none", "zstd", "lz4"])
def test_multi_chunk_arrays_with_a_padded_edge_round_trip(tmp_path, compression):
    """Chunks read straight into the tensor, the edge chunk's padding checksummed, not kept."""
    from daskrl.config import Compression
    from daskrl.store._format import encode_batch

    url = str(tmp_path / "s")
    w = TrajectoryStore(url, read_only=False)
    w.initialize()
    rng = np.random.default_rng(3)
    arrays = {"observation": rng.standard_normal((37, 5, 10)).astype(np.float32),
              "step": np.arange(37 * 5, dtype=np.int64).reshape(37, 5)}
    path, _ = w.write_batch(0, arrays, _meta(37, 5), compression=compression)
    small = encode_batch({**_meta(37, 5), "batch_id": 0, "path": path}, arrays,
                         Compression(compression), chunk_bytes=4096)  # 2 chunks, one padded
    (tmp_path / "s" / path).write_bytes(b"".join(bytes(memoryview(p).cast("B"))
                                                for p in small.parts()))
    with zipfile.ZipFile(tmp_path / "s" / path) as z:
        chunks = sorted(n for n in z.namelist() if n.startswith("observation/c/"))
        edge = z.getinfo("observation/c/1/0/0")
    assert chunks == ["observation/c/0/0/0", "observation/c/1/0/0"]
    got = daskrl.open_store(url).load(0)
    for k, v in arrays.items():
        np.testing.assert_array_equal(got[k].numpy(), v)
    if compression == "none":  # flip a byte of the edge chunk's padding: still detected
        zpath = tmp_path / "s" / path
        raw = bytearray(zpath.read_bytes())
        raw[edge.header_offset + 30 + len(edge.filename) + edge.file_size - 6] ^= 0x01
        zpath.write_bytes(bytes(raw))
        with pytest.raises(daskrl.StoreError, match=re.escape("crc32c mismatch")):
            daskrl.open_store(url).load(0)


def test_compressed_chunks_must_decode_to_exactly_the_chunk_size():
    """No decompression bomb: declared sizes are checked before anything is inflated."""
    import gzip

    import numcodecs

    from daskrl.store._format.allowlist import ArrayLayout
    from daskrl.store._format.chunks import ChunkError, decode_chunk

    def layout(comp):
        return ArrayLayout((4,), np.dtype(np.float32), (4,), "/", 0.0, False, comp, False)

    out = np.empty(4, np.float32)
    big = np.zeros(1 << 20, np.float32)
    with pytest.raises(ChunkError, match=re.escape(f"zstd frame declares {big.nbytes} bytes, expected 16")):
        decode_chunk(numcodecs.Zstd().encode(big), layout("zstd"), out)
    with pytest.raises(ChunkError, match=re.escape("blosc header declares 4194304 bytes, expected 16")):
        decode_chunk(numcodecs.Blosc().encode(big), layout("blosc"), out)
    with pytest.raises(ChunkError, match=re.escape("gzip stream does not decode to exactly 16 bytes")):
        decode_chunk(gzip.compress(big.tobytes()), layout("gzip"), out)
    decode_chunk(gzip.compress(np.arange(4, dtype=np.float32).tobytes()), layout("gzip"), out)
    np.testing.assert_array_equal(out, np.arange(4))
