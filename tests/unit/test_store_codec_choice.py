"""The writer picks each array's codec by what it gains (issue 14): an array whose compression
saves under 10 % is stored raw, decided from a stream's first batch and remembered for its
later ones; the decision is in each array's ``zarr.json``, so zarr alone reads every batch, and
stores whose every array is compressed (written before) read as they did.  The reader's
shortcuts for batches of one shape (compiled plans, documents recognized by their bytes) keep
every check: damage in a later batch of a known shape is still found."""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.storage import ZipStore

import daskrl
from daskrl import StoreError, StoreFormatError
from daskrl._checksums import crc32c
from daskrl.store import TrajectoryStore
from daskrl.store._format.codec_choice import MIN_SAVED_BYTES, MIN_SAVING, CodecChoices

pytestmark = pytest.mark.timeout(120)

T, E = 256, 16


def _arrays(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    frames = np.full((T, E, 16, 16), 40, np.uint8)
    frames[:, :, 4:8, 4:8] = 200
    return {
        "observation": rng.standard_normal((T, E, 5)).astype(np.float32),  # incompressible
        "pixels": frames,  # compressible (flat frames with a sprite)
        "episode_id": np.repeat(np.arange(E, dtype=np.int64)[None], T, 0),  # 32 KiB
        "terminated": rng.random((T, E)) < 0.01,
        "counter": np.broadcast_to(np.arange(T, dtype=np.int64)[:, None, None],  # 128 KiB
                                   (T, E, 4)).copy(),
    }


def _meta(stream: int = 0) -> dict:
    return {"frames": T * E, "weights_version": 0, "worker": "w", "device": "cpu",
            "episode_returns": [], "episode_lengths": [], "shape": [T, E], "stream": stream}


def _writer(root: Path) -> TrajectoryStore:
    w = TrajectoryStore(str(root), read_only=False)
    w.initialize()
    return w


def _codecs(root: Path, path: str) -> dict[str, list[str]]:
    """Each array's codec names, from its zarr.json in the container."""
    with zipfile.ZipFile(root / path) as z:
        return {n[:-len("/zarr.json")]: [c["name"] for c in json.loads(z.read(n))["codecs"]]
                for n in z.namelist() if n.endswith("/zarr.json")}


def _compressor(root: Path, path: str) -> dict[str, str]:
    with zipfile.ZipFile(root / path) as z:
        out = {}
        for n in z.namelist():
            if n.endswith("/zarr.json"):
                codecs = json.loads(z.read(n))["codecs"]
                out[n[:-len("/zarr.json")]] = (
                    "raw" if len(codecs) == 2 else codecs[1]["name"] if codecs[1]["name"] != "blosc"
                    else f"blosc-{codecs[1]['configuration']['cname']}")
        return out


def _zarr_read(root: Path, path: str) -> dict[str, np.ndarray]:
    with ZipStore(str(root / path), mode="r") as container:
        group = zarr.open_group(container, mode="r")
        return {name: a[...] for name, a in group.arrays()}


@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_an_incompressible_array_is_stored_raw_and_compressible_ones_compressed(
        tmp_path, compression):
    root = tmp_path / "s"
    w = _writer(root)
    arrays = _arrays()
    path, _ = w.write_batch(0, arrays, _meta(), compression=compression)
    got = _compressor(root, path)
    assert got["observation"] == "raw"
    assert got["pixels"] == ("zstd" if compression == "zstd" else "blosc-lz4")
    # zstd on elements wider than a byte: blosc's zstd after a byte shuffle
    assert got["counter"] == ("blosc-zstd" if compression == "zstd" else "blosc-lz4")
    # 32 KiB of ids and 4 KiB of flags save under MIN_SAVED_BYTES (64 KiB): reading a
    # compressed chunk costs more than reading them raw
    assert got["episode_id"] == got["terminated"] == "raw"
    assert all(c[-1] == "crc32c" and c[0] == "bytes" for c in _codecs(root, path).values())
    # zarr alone reads both kinds, and daskrl reads what zarr reads
    by_zarr = _zarr_read(root, path)
    loaded = daskrl.open_store(str(root)).load(0)
    for k, a in arrays.items():
        np.testing.assert_array_equal(by_zarr[k], a)
        np.testing.assert_array_equal(loaded[k].numpy(), a)
    # the store is smaller than the raw arrays, and the raw one is stored at its size
    with zipfile.ZipFile(root / path) as z:
        sizes = {i.filename: i.file_size for i in z.infolist()}
    assert sizes["observation/c/0/0/0"] == arrays["observation"].nbytes + 4
    assert sizes["pixels/c/0/0/0/0"] < arrays["pixels"].nbytes / 10


def test_the_decision_is_remembered_per_stream_and_retried(tmp_path):
    root = tmp_path / "s"
    w = _writer(root)
    w._writer.codec_choices = CodecChoices(retry_every=3)
    noisy, flat = _arrays(), _arrays()
    flat["observation"] = np.zeros_like(flat["observation"])  # now compressible
    paths = [w.write_batch(0, noisy, _meta(stream=0), compression="zstd")[0],
             w.write_batch(1, flat, _meta(stream=0), compression="zstd")[0],  # remembered: raw
             w.write_batch(2, flat, _meta(stream=1), compression="zstd")[0],  # its own decision
             w.write_batch(3, flat, _meta(stream=0), compression="zstd")[0],  # still raw
             w.write_batch(4, flat, _meta(stream=0), compression="zstd")[0]]  # retried: zstd
    kinds = [_compressor(root, p)["observation"] for p in paths]
    assert kinds == ["raw", "raw", "blosc-zstd", "raw", "blosc-zstd"]
    # a compressed array that stops compressing goes raw at once (its size is known)
    p5, _ = w.write_batch(5, noisy, _meta(stream=1), compression="zstd")
    assert _compressor(root, p5)["observation"] == "raw"
    r = daskrl.open_store(str(root))
    for bid, a in [(0, noisy), (1, flat), (2, flat), (3, flat), (4, flat), (5, noisy)]:
        np.testing.assert_array_equal(r.load(bid)["observation"].numpy(), a["observation"])
        np.testing.assert_array_equal(_zarr_read(root, paths[bid] if bid < 5 else p5)[
            "observation"], a["observation"])


def test_codec_choices_judge_by_the_saving():
    c = CodecChoices(min_saved_bytes=0)
    assert c.should_try("k")  # undecided: try
    assert not c.judge("k", 1000, int(1000 * (1 - MIN_SAVING)) + 1)  # saves under 10 %: raw
    assert not c.should_try("k")
    assert c.judge("j", 1000, int(1000 * (1 - MIN_SAVING)))  # saves 10 %: compressed
    assert c.should_try("j")
    assert c.decisions() == {"k": False, "j": True}
    big = CodecChoices()
    assert not big.judge("small", MIN_SAVED_BYTES, 1)  # saves 99 % but under 4 KiB
    assert big.judge("large", 10 * MIN_SAVED_BYTES, 1)
    with pytest.raises(ValueError):
        CodecChoices(min_saving=1.0)


def test_stores_whose_every_array_is_compressed_still_read(tmp_path):
    """What format 2.2 writers wrote: every array through the plain codec (zstd on floats and
    ints alike); the unit test of the container's bytes pins that encoding."""
    root = tmp_path / "s"
    w = _writer(root)
    w._writer.codec_choices = None
    batches = [_arrays(seed=i) for i in range(3)]
    for i, a in enumerate(batches):
        path, _ = w.write_batch(i, a, _meta(), compression="zstd")
        assert set(_compressor(root, path).values()) == {"zstd"}
    r = daskrl.open_store(str(root))
    for _ in range(2):  # the second pass reads through the reader's cached plans
        for i, a in enumerate(batches):
            got = r.load(i)
            for k, v in a.items():
                np.testing.assert_array_equal(got[k].numpy(), v)


def _flip(file: Path, offset: int) -> None:
    data = bytearray(file.read_bytes())
    data[offset] ^= 0x01
    file.write_bytes(bytes(data))


def _member_offset(file: Path, name: str) -> tuple[int, int]:
    """(offset of the member's local header, offset of its data)."""
    with zipfile.ZipFile(file) as z:
        info = z.getinfo(name)
    return info.header_offset, info.header_offset + 30 + len(name.encode())


def test_damage_in_a_later_batch_of_a_known_shape_is_found(tmp_path):
    root = tmp_path / "s"
    w = _writer(root)
    n = 5
    paths = [w.write_batch(i, _arrays(seed=i), _meta(), compression="zstd")[0] for i in range(n)]
    r = daskrl.open_store(str(root))
    r.load(0)  # the shape is known now: plan compiled, documents remembered
    # 1: a raw chunk's data
    _, data = _member_offset(root / paths[1], "observation/c/0/0/0")
    _flip(root / paths[1], data + 7)
    with pytest.raises(StoreError, match=r"crc32c mismatch.*|chunk 'observation/c/0/0/0'"):
        r.load(1)
    # 2: a compressed chunk's data, its crc32c made to match: the decoder refuses it
    _, data = _member_offset(root / paths[2], "pixels/c/0/0/0/0")
    with zipfile.ZipFile(root / paths[2]) as z:
        size = z.getinfo("pixels/c/0/0/0/0").file_size
    blob = bytearray((root / paths[2]).read_bytes())
    blob[data + 5] ^= 0xFF  # inside the zstd frame header's content size
    blob[data + size - 4:data + size] = crc32c(bytes(blob[data:data + size - 4])).to_bytes(4, "little")
    (root / paths[2]).write_bytes(bytes(blob))
    with pytest.raises(StoreError, match="pixels"):
        r.load(2)
    # 3: an array's zarr.json (same size, different content): its zip CRC-32 fails
    head, data = _member_offset(root / paths[3], "observation/zarr.json")
    blob = bytearray((root / paths[3]).read_bytes())
    at = blob.index(b'"float32"', data)
    blob[at:at + 9] = b'"float64"'
    (root / paths[3]).write_bytes(bytes(blob))
    with pytest.raises(StoreFormatError, match=re.escape("observation/zarr.json")):
        r.load(3)
    # 4: a local header's CRC-32 field
    head, _ = _member_offset(root / paths[4], "episode_id/c/0/0")
    _flip(root / paths[4], head + 14)
    with pytest.raises(StoreFormatError, match="episode_id"):
        r.load(4)
    # the undamaged batch still reads, through the same cached plan
    np.testing.assert_array_equal(r.load(0)["observation"].numpy(), _arrays(seed=0)["observation"])


def test_large_batches_of_one_shape_read_with_their_own_checksums(tmp_path):
    """Batches of more than a MiB are read by the general (parallel) executor: each with its
    own CRC-32s, never those of the first batch of its shape."""
    root = tmp_path / "s"
    w = _writer(root)
    rng = np.random.default_rng(0)
    batches = [{"observation": rng.standard_normal((64, 8, 600)).astype(np.float32),  # 1.2 MB
                "noise": rng.integers(0, 256, (64, 8, 32, 32), dtype=np.uint8),
                "episode_id": np.repeat(np.arange(8, dtype=np.int64)[None], 64, 0)}
               for _ in range(3)]  # raw arrays of one size: one directory structure
    for i, a in enumerate(batches):
        w.write_batch(i, a, _meta(), compression="zstd")
    r = daskrl.open_store(str(root))
    for i, a in enumerate(batches):
        got = r.load(i)
        for k, v in a.items():
            np.testing.assert_array_equal(got[k].numpy(), v)
