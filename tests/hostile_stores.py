"""Real stores written by daskrl's writer, then damaged or crafted the way a hostile or broken
store would be: shared by tests/test_hostile_store.py (the checks that need a child process)
and tests/unit/test_hostile_store.py (the rest)."""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

import numpy as np
from sample_batches import sample_arrays as _arrays
from sample_batches import sample_meta as _meta

from daskrl._checksums import crc32c
from daskrl.store import TrajectoryStore


def written_store(tmp_path: Path, n: int = 3, compression: str = "lz4", arrays=None,
                  name: str = "s"):
    """``(url, root, [container paths])`` of a real store of ``n`` batches written by daskrl."""
    root = tmp_path / name
    w = TrajectoryStore(str(root), read_only=False)
    w.initialize()
    paths = []
    for b in range(n):
        a = arrays if arrays is not None else _arrays(seed=b)
        T, E = next(iter(a.values())).shape[:2]
        paths.append(w.write_batch(b, a, _meta(T, E), compression=compression)[0])
    return str(root), root, paths


def read_members(zpath: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(zpath) as z:
        return {n: z.read(n) for n in z.namelist()}


def write_members(zpath: Path, members: dict[str, bytes]) -> None:
    """The container rewritten by Python's zipfile (stored, valid CRC-32s): only the chunk or
    document we crafted differs, as a hostile writer would do it."""
    zpath.unlink()
    with zipfile.ZipFile(zpath, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


def blosc_frame(nbytes: int, blocksize: int, cbytes: int, *, memcpyed: bool,
                typesize: int = 1, body: bytes = b"") -> bytes:
    """A blosc 1.x frame header (+ body) with the given claims, and a valid crc32c after it
    (the checksum protects against damage, not against whoever crafted the chunk)."""
    flags = 0x01 | (0x02 if memcpyed else 0) | (1 << 5)  # shuffle, [memcpyed], lz4
    frame = struct.pack("<BBBBIII", 2, 1, flags, typesize, nbytes, blocksize, cbytes) + body
    return frame + crc32c(frame).to_bytes(4, "little")


def crafted_store(tmp_path: Path, chunk: bytes, shape: tuple[int, ...] = (4096, 16)) -> str:
    """A store whose batch 0 has a ``blob`` array (uint8 ``shape``, one chunk, lz4 blosc) whose
    one chunk member is ``chunk``; the array document declares the chunk's size."""
    url, root, paths = written_store(tmp_path, n=1,
                                     arrays={"blob": np.zeros((8, 16), np.uint8)})
    zpath = root / paths[0]
    members = read_members(zpath)
    doc = json.loads(members["blob/zarr.json"])
    # the writer stores so small an array raw: declare the lz4 blosc codec
    doc["codecs"] = [{"name": "bytes"}, {"name": "blosc", "configuration": {
        "typesize": 1, "cname": "lz4", "clevel": 1, "shuffle": "shuffle", "blocksize": 0}},
        {"name": "crc32c"}]
    doc["shape"] = list(shape)
    doc["chunk_grid"]["configuration"]["chunk_shape"] = list(shape)
    members["blob/zarr.json"] = json.dumps(doc).encode()
    members["blob/c/0/0"] = chunk
    write_members(zpath, members)
    return url
