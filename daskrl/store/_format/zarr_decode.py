"""Read a batch's zarr v3 arrays into torch tensors, refusing anything outside an allowlist.

The mirror of :mod:`daskrl.store._format.encode`.  This module reads format 1.x batches (a group
directory) and holds the allowlist and chunk decoding that :mod:`daskrl.store._format.zip_decode` applies to
the zip containers of format 2.x.  A store may come from anywhere, so its metadata is
checked before any data is read: zarr format 3, a numeric or bool ``data_type``, a regular chunk
grid with the default key encoding, and the codec chain ``bytes`` → at most one of ``zstd``,
``blosc``, ``gzip`` → optionally ``crc32c``.  Nothing else is interpreted (no pickle, no
object, string or structured dtypes, no unknown codecs or extensions), so opening an untrusted
store cannot run code; a refusal is a :class:`~daskrl.StoreFormatError` naming the batch and
array.

Chunks are decoded straight into the result tensor (one copy per array): on a local path an
uncompressed chunk is read into the tensor's memory with ``readinto``, a compressed one is
decompressed into it, and the checksum is verified on the way; many chunks are read at once by a
thread pool (local files) or one concurrent burst of requests (fsspec stores).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import json
import math
import os
import struct
import zlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import torch
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import LocalStore

from daskrl._checksums import crc32c
from daskrl.errors import BatchNotFoundError, StoreError, StoreFormatError
from daskrl.store._format import local_io
from daskrl.store._format.zip_container import ZipFormatError

__all__ = [
    "ALLOWED_CODECS",
    "ALLOWED_DATA_TYPES",
    "ArrayLayout",
    "check_array_metadata",
    "decode_chunk",
    "read_arrays",
]

ALLOWED_DATA_TYPES = frozenset({
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
})
"""zarr v3 ``data_type`` values a reader accepts: numeric and bool only."""

ALLOWED_CODECS = frozenset({"bytes", "zstd", "blosc", "gzip", "crc32c"})
"""Codec names a reader accepts, in the chain ``bytes`` → [compressor] → [``crc32c``]."""

_COMPRESSORS = {"zstd": {"level", "checksum"},
                "blosc": {"cname", "clevel", "shuffle", "typesize", "blocksize"},
                "gzip": {"level"}}
_ARRAY_KEYS = {"zarr_format", "node_type", "shape", "data_type", "chunk_grid",
               "chunk_key_encoding", "fill_value", "codecs", "attributes", "dimension_names",
               "storage_transformers"}
MAX_CHUNK_BYTES = 1 << 32
"""Largest decoded chunk accepted (4 GiB); daskrl writes chunks of at most 8 MiB per step."""
_PARALLEL_BYTES = 1 << 20
"""Batches smaller than this are read on the calling thread (pool overhead would dominate)."""
_CRC_BLOCK = 256 << 10
"""Bytes read per ``readinto`` before checksumming them (while they are in the CPU cache)."""
_SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


@dataclasses.dataclass(frozen=True)
class ArrayLayout:
    """What a reader needs from a validated array ``zarr.json``."""

    shape: tuple[int, ...]
    dtype: np.dtype
    """Native-endian numpy dtype of the decoded array."""
    chunk_shape: tuple[int, ...]
    separator: str
    fill_value: Any
    big_endian: bool
    compressor: str | None
    """``"zstd"``, ``"blosc"``, ``"gzip"`` or None."""
    checksum: bool
    """Chunks end with a crc32c of what precedes it."""
    blosc_typesize: int | None = None
    """The blosc codec's configured ``typesize``, if any."""

    @property
    def chunk_nbytes(self) -> int:
        return math.prod(self.chunk_shape) * self.dtype.itemsize

    @functools.cached_property
    def max_stored_bytes(self) -> int:
        """Most bytes a stored chunk of this array may hold: its decoded size plus what its
        codecs add at worst (zstd, gzip and blosc stay within 1/128 plus 64 KiB)."""
        n = self.chunk_nbytes
        return n + (n // 128 + (64 << 10) if self.compressor else 0) + 4 * self.checksum

    @functools.cached_property
    def grid(self) -> tuple[tuple[tuple[str, tuple[slice, ...]], ...], frozenset[str]]:
        """:meth:`chunks` as a tuple, and the set of their keys (computed once per layout)."""
        chunks = tuple(self.chunks())
        return chunks, frozenset(k for k, _ in chunks)

    def chunks(self) -> Iterator[tuple[str, tuple[slice, ...]]]:
        """``(key suffix, region of the array)`` of every chunk, in C order."""
        grid = [range(-(-n // c)) if n else range(0) for n, c in zip(self.shape, self.chunk_shape)]
        for idx in itertools.product(*grid):
            key = "c" + "".join(f"{self.separator}{i}" for i in idx) if idx else "c"
            region = tuple(slice(i * c, min((i + 1) * c, n))
                           for i, c, n in zip(idx, self.chunk_shape, self.shape))
            yield key, region


def _refuse(where: str, problem: str) -> StoreFormatError:
    return StoreFormatError(
        f"{where}: {problem}. daskrl reads only plain zarr v3 arrays (numeric or bool "
        f"data_type; codecs bytes -> at most one of zstd, blosc, gzip -> optional crc32c) and "
        "refuses anything else so that an untrusted store cannot run code; this array was not "
        "read. Was the store written by something other than daskrl?"
    )


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _fill_value(value: Any, dtype: np.dtype, where: str) -> Any:
    kind = dtype.kind
    if kind == "b" and isinstance(value, bool):
        return value
    if kind in "iu" and _is_int(value):
        info = np.iinfo(dtype)
        if info.min <= value <= info.max:
            return value
    if kind == "f":
        if isinstance(value, str) and value in _SPECIAL_FLOATS:
            return _SPECIAL_FLOATS[value]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    if kind == "c" and isinstance(value, list) and len(value) == 2:
        parts = [_fill_value(v, np.dtype(np.float64), where) for v in value]
        return complex(parts[0], parts[1])
    raise _refuse(where, f"fill_value {value!r} does not fit data_type {dtype.name!r}")


def check_array_metadata(doc: Any, where: str) -> ArrayLayout:
    """Validate an array's ``zarr.json`` document against the allowlist.

    Parameters
    ----------
    doc
        The parsed JSON document.
    where
        Names the batch and array in error messages.

    Raises
    ------
    StoreFormatError
        When anything in ``doc`` is outside the allowlist.
    """
    try:
        return _check_array_metadata(doc, where)
    except StoreFormatError:
        raise
    except Exception as e:  # a document of a shape no check foresaw: refused all the same
        raise _refuse(where, f"zarr.json is malformed ({type(e).__name__}: {e})") from None


def _check_array_metadata(doc: Any, where: str) -> ArrayLayout:
    if not isinstance(doc, dict):
        raise _refuse(where, f"zarr.json is a {type(doc).__name__}, expected a JSON object")
    if doc.get("zarr_format") != 3:
        raise _refuse(where, f"zarr_format is {doc.get('zarr_format')!r}, expected 3")
    if doc.get("node_type") != "array":
        raise _refuse(where, f"node_type is {doc.get('node_type')!r}, expected 'array'")
    for key, value in doc.items():
        if key not in _ARRAY_KEYS and not (
            isinstance(value, dict) and value.get("must_understand") is False
        ):
            raise _refuse(where, f"unknown metadata key {key!r} (an extension this reader "
                                 "does not understand)")
    data_type = doc.get("data_type")
    if not isinstance(data_type, str) or data_type not in ALLOWED_DATA_TYPES:
        raise _refuse(where, f"data_type {data_type!r} is not allowed; allowed: "
                             f"{sorted(ALLOWED_DATA_TYPES)}")
    dtype = np.dtype(data_type)
    shape = doc.get("shape")
    if not isinstance(shape, list) or not all(_is_int(n) and n >= 0 for n in shape):
        raise _refuse(where, f"shape {shape!r} is not a list of non-negative integers")
    grid = doc.get("chunk_grid")
    chunk_shape = grid.get("configuration", {}).get("chunk_shape") if isinstance(grid, dict) else None
    if (
        not isinstance(grid, dict)
        or grid.get("name") != "regular"
        or not isinstance(chunk_shape, list)
        or len(chunk_shape) != len(shape)
        or not all(_is_int(c) and c > 0 for c in chunk_shape)
    ):
        raise _refuse(where, f"chunk_grid {grid!r} is not a regular grid matching shape {shape}")
    if math.prod(chunk_shape) * dtype.itemsize > MAX_CHUNK_BYTES:
        raise _refuse(where, f"chunk_shape {chunk_shape} exceeds {MAX_CHUNK_BYTES} bytes")
    enc = doc.get("chunk_key_encoding")
    sep = enc.get("configuration", {}).get("separator", "/") if isinstance(enc, dict) else None
    if not isinstance(enc, dict) or enc.get("name") != "default" or sep not in ("/", "."):
        raise _refuse(where, f"chunk_key_encoding {enc!r} is not the default encoding")
    if doc.get("storage_transformers", []) != []:
        raise _refuse(where, f"storage_transformers {doc['storage_transformers']!r} are not allowed")
    names = doc.get("dimension_names")
    if names is not None and not (
        isinstance(names, list) and all(n is None or isinstance(n, str) for n in names)
    ):
        raise _refuse(where, f"dimension_names {names!r} is not a list of strings or nulls")
    big_endian, compressor, checksum, typesize = _check_codecs(doc.get("codecs"), dtype, where)
    return ArrayLayout(
        shape=tuple(shape),
        dtype=dtype,
        chunk_shape=tuple(chunk_shape),
        separator=sep,
        fill_value=_fill_value(doc.get("fill_value"), dtype, where),
        big_endian=big_endian,
        compressor=compressor,
        checksum=checksum,
        blosc_typesize=typesize,
    )


def _check_codecs(codecs: Any, dtype: np.dtype, where: str
                  ) -> tuple[bool, str | None, bool, int | None]:
    if not isinstance(codecs, list) or not codecs:
        raise _refuse(where, f"codecs {codecs!r} is not a non-empty list")
    parsed: list[tuple[str, dict[str, Any]]] = []
    for c in codecs:
        if isinstance(c, str):
            c = {"name": c}
        name = c.get("name") if isinstance(c, dict) else None
        conf = c.get("configuration", {}) if isinstance(c, dict) else None
        if (not isinstance(name, str) or name not in ALLOWED_CODECS or not isinstance(conf, dict)
                or set(c) - {"name", "configuration"}):
            raise _refuse(where, f"codec {c!r} is not allowed; allowed codecs: "
                                 f"{sorted(ALLOWED_CODECS)}")
        parsed.append((name, conf))
    names = [n for n, _ in parsed]
    chain_ok = (
        names[0] == "bytes"
        and len(names) <= 3
        and all(n in _COMPRESSORS or n == "crc32c" for n in names[1:])
        and names.count("crc32c") <= 1
        and (names[-1] == "crc32c" or "crc32c" not in names)
        and sum(n in _COMPRESSORS for n in names) <= 1
    )
    if not chain_ok:
        raise _refuse(where, f"codec chain {names} is not bytes -> [compressor] -> [crc32c]")
    endian = parsed[0][1].get("endian", "little")
    if set(parsed[0][1]) - {"endian"} or endian not in ("little", "big"):
        raise _refuse(where, f"bytes codec configuration {parsed[0][1]!r} is not allowed")
    compressor = None
    typesize = None
    for name, conf in parsed[1:]:
        if name == "crc32c":
            if conf:
                raise _refuse(where, f"crc32c codec configuration {conf!r} is not allowed")
            continue
        if set(conf) - _COMPRESSORS[name]:
            raise _refuse(where, f"{name} codec configuration {conf!r} has unknown keys")
        compressor = name
        if name == "blosc" and "typesize" in conf:
            typesize = conf["typesize"]
            if not (_is_int(typesize) and 1 <= typesize <= 255):
                raise _refuse(where, f"blosc typesize {typesize!r} is not an integer in 1..255")
    return endian == "big" and dtype.itemsize > 1, compressor, names[-1] == "crc32c", typesize


# -- decoding ---------------------------------------------------------------------------------
def _zstd_content_size(buf: np.ndarray) -> int | None:
    """Decompressed size declared in a zstd frame header (None if absent)."""
    if buf.size < 6 or int.from_bytes(bytes(buf[:4]), "little") != 0xFD2FB528:
        return None
    fhd = int(buf[4])
    single = (fhd >> 5) & 1
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3]
    size = (1 if single else 0, 2, 4, 8)[fhd >> 6]
    if size == 0 or buf.size < pos + size:
        return None
    value = int.from_bytes(bytes(buf[pos:pos + size]), "little")
    return value + 256 if size == 2 else value


class ChunkError(ValueError):
    """A chunk failed its checksum or does not decode to the chunk's size."""


_BLOSC_FORMATS = {0: "blosclz", 1: "lz4", 2: "snappy", 3: "zlib", 4: "zstd"}
_BLOSC_MEMCPYED = 0x02
_BLOSC_KNOWN_FLAGS = 0x01 | 0x02 | 0x04 | 0x10 | 0xE0  # shuffle, memcpyed, bitshuffle, no split, codec
_BLOSC_MAX_BLOCKSIZE = 1 << 28  # c-blosc 1.x's BLOSC_MAX_BLOCKSIZE
_BLOSC_HEADER = struct.Struct("<BBBBIII")  # version, versionlz, flags, typesize, nbytes, blocksize, cbytes
_BLOSC_STARTS = [struct.Struct(f"<{n}I") for n in range(257)]


def check_blosc_header(buf: np.ndarray, expected: int, layout: ArrayLayout) -> None:
    """Check a blosc 1.x frame's header against the chunk before decoding it.

    c-blosc trusts its 16-byte header: it reads up to the ``cbytes`` the header claims (past the
    buffer when the claim is larger: the reader's own memory would come back as data) and
    checks block offsets against that claim only.  So every field is checked here: format
    version 2, known flags and codec, ``typesize`` (1, the data type's size or the configured
    one), ``nbytes`` the chunk's size, ``blocksize`` within it, ``cbytes`` exactly the buffer's
    size, and the block offsets inside the buffer.
    """
    if buf.size < 16:
        raise ChunkError(f"blosc frame of {buf.size} bytes is shorter than its 16-byte header")
    version, _, flags, typesize, nbytes, blocksize, cbytes = _BLOSC_HEADER.unpack_from(buf)
    if nbytes != expected:
        raise ChunkError(f"blosc header declares {nbytes} bytes, expected {expected}")
    if cbytes != buf.size:
        raise ChunkError(f"blosc header declares a frame of {cbytes} bytes; the chunk holds "
                         f"{buf.size}")
    if version != 2 or flags & ~_BLOSC_KNOWN_FLAGS & 0xFF or (flags >> 5) not in _BLOSC_FORMATS:
        raise ChunkError(f"blosc header has format version {version} and flags {flags:#04x}; "
                         "expected a blosc 1.x frame (version 2) of a known codec")
    if typesize not in (1, layout.dtype.itemsize, layout.blosc_typesize):
        raise ChunkError(f"blosc header declares typesize {typesize}; the array's elements "
                         f"have {layout.dtype.itemsize} bytes")
    if nbytes == 0:
        return
    if not 0 < blocksize <= min(nbytes, _BLOSC_MAX_BLOCKSIZE):
        raise ChunkError(f"blosc header declares blocks of {blocksize} bytes for a chunk of "
                         f"{nbytes}")
    if flags & _BLOSC_MEMCPYED:
        if cbytes != nbytes + 16:
            raise ChunkError(f"uncompressed blosc frame holds {cbytes} bytes, expected "
                             f"{nbytes + 16}")
        return
    nblocks = -(-nbytes // blocksize)
    first = 16 + 4 * nblocks
    if first > cbytes:
        raise ChunkError(f"blosc frame of {cbytes} bytes cannot hold the offsets of its "
                         f"{nblocks} blocks")
    if nblocks <= 256:  # the usual few blocks: cheaper than numpy
        starts = _BLOSC_STARTS[nblocks].unpack_from(buf, 16)
        lo, hi = min(starts), max(starts)
    else:
        starts = buf[16:first].view("<u4")
        lo, hi = int(starts.min()), int(starts.max())
    if lo < first or hi > cbytes - 4:
        raise ChunkError("blosc block offsets lie outside the frame")


def decode_chunk(data: Any, layout: ArrayLayout, out: np.ndarray) -> None:
    """Decode one stored chunk into ``out`` (C-contiguous, chunk-shaped, native dtype).

    Raises :class:`ChunkError` when the checksum or the decoded size is wrong.
    """
    buf = np.frombuffer(data, np.uint8)
    if layout.checksum:
        _verify_crc(buf)
        buf = buf[:-4]
    expected = out.nbytes
    if layout.compressor is None:
        if buf.size != expected:
            raise ChunkError(f"chunk holds {buf.size} bytes, expected {expected}")
        out.reshape(-1).view(np.uint8)[:] = buf
    elif layout.compressor == "zstd":
        # Frames must declare their size (zstd's one-shot compression, as zarr and daskrl use,
        # always does): a frame that does not could inflate without bound.
        declared = _zstd_content_size(buf)
        if declared != expected:
            raise ChunkError(f"zstd frame declares {declared} bytes, expected {expected}")
        _codec_decode(numcodecs.Zstd(), "zstd", buf, out)
    elif layout.compressor == "blosc":
        check_blosc_header(buf, expected, layout)
        _codec_decode(numcodecs.Blosc(), "blosc", buf, out)
    else:  # gzip, bounded so that a bomb cannot inflate past the chunk's size
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        raw = d.decompress(buf.tobytes(), expected + 1)
        if len(raw) != expected or not d.eof:
            raise ChunkError(f"gzip stream does not decode to exactly {expected} bytes")
        out.reshape(-1).view(np.uint8)[:] = np.frombuffer(raw, np.uint8)
    if layout.big_endian:
        out.byteswap(inplace=True)


def _codec_decode(codec: Any, name: str, buf: np.ndarray, out: np.ndarray) -> None:
    try:
        codec.decode(buf, out=out)
    except Exception as e:  # the codec's own errors (RuntimeError, ValueError) name no chunk
        raise ChunkError(f"{name} frame does not decode ({e})") from e


def _verify_crc(buf: np.ndarray) -> None:
    if buf.size < 4:
        raise ChunkError(f"chunk of {buf.size} bytes is too short to hold its crc32c")
    stored = int.from_bytes(bytes(buf[-4:]), "little")
    computed = crc32c(buf[:-4])
    if stored != computed:
        raise ChunkError(
            f"crc32c mismatch (stored {stored:#010x}, computed {computed:#010x}): the chunk "
            "is corrupt or was modified"
        )


def _read_local(root: str, key: str, layout: ArrayLayout, out: np.ndarray, valid: int,
                checked: set[str]) -> bool:
    """Read the chunk file ``path`` into ``out``; False if the file does not exist.

    ``out`` is C-contiguous.  For an uncompressed little-endian chunk it may hold only the
    first ``valid`` bytes of the chunk (a padded edge chunk whose padding is not wanted): the
    bytes are read straight into ``out`` with ``readinto`` (the kernel's copy is the only one)
    and the checksum is computed over them and the padding.
    """
    try:  # a regular file inside the store: no link out of it, no FIFO to block on
        fd = local_io.open_regular(root, key, checked)
    except (FileNotFoundError, NotADirectoryError):
        return False
    f = open(fd, "rb", buffering=0)  # noqa: SIM115 - closed below; raw readinto
    with f:
        if layout.compressor is None and not layout.big_endian:
            dest = out.reshape(-1).view(np.uint8)[:valid]
            n = 0
            view = memoryview(dest)
            computed = 0
            while n < valid:
                # block by block, so the checksum reads each block while it is still in cache
                got = f.readinto(view[n:n + _CRC_BLOCK])
                if not got:
                    break
                if layout.checksum:
                    computed = crc32c(dest[n:n + got], computed)
                n += got
            tail = f.readall()
            want_tail = layout.chunk_nbytes - valid + (4 if layout.checksum else 0)
            if n != valid or len(tail) != want_tail:
                raise ChunkError(f"chunk holds {n + len(tail)} bytes, expected "
                                 f"{valid + want_tail}")
            if layout.checksum:
                stored = int.from_bytes(tail[-4:], "little")
                if len(tail) > 4:
                    computed = crc32c(tail[:-4], computed)
                if stored != computed:
                    raise ChunkError(
                        f"crc32c mismatch (stored {stored:#010x}, computed {computed:#010x}): "
                        "the chunk is corrupt or was modified"
                    )
            return True
        size = os.fstat(fd).st_size
        if size > layout.max_stored_bytes:
            raise ChunkError(f"chunk file holds {size} bytes; a chunk of this array holds at "
                             f"most {layout.max_stored_bytes}")
        data = f.read(layout.max_stored_bytes + 1)
        if len(data) > layout.max_stored_bytes:
            raise ChunkError(f"chunk file holds more than {layout.max_stored_bytes} bytes")
    decode_chunk(data, layout, out)
    return True


def empty_tensor(shape: tuple[int, ...], dtype: np.dtype, pin: bool) -> torch.Tensor:
    """An uninitialized CPU tensor to decode into: pinned (for a CUDA target) by torch, else
    allocated by numpy.  Large numpy buffers come from malloc, which reuses freed memory; torch's
    allocator maps fresh pages, whose first touch (page faults, and huge-page compaction where
    transparent huge pages are on) cost more than reading a batch from the page cache."""
    if pin:
        return torch.empty(shape, dtype=_torch_dtype(dtype), pin_memory=True)
    return torch.from_numpy(np.empty(shape, dtype))


@functools.lru_cache(maxsize=64)
def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype)).dtype


def list_arrays(zstore: Any, path: str) -> list[str]:
    """Names of the arrays (sub-directories) of the group at ``path``."""
    async def _ls() -> list[str]:
        return [k async for k in zstore.list_dir(path + "/")]

    local = isinstance(zstore, LocalStore)
    listed = local_io.listdir(zstore.root, path) if local else sync(_ls())
    names = (k.rstrip("/") for k in listed)
    return sorted(n for n in names if n and n != "zarr.json" and "." not in n)


def _read_raw_metadata(zstore: Any, path: str, names: Sequence[str]) -> list[bytes | None]:
    proto = default_buffer_prototype()

    async def _get() -> list[Any]:
        return await asyncio.gather(*(zstore.get(f"{path}/{n}/zarr.json", prototype=proto)
                                      for n in names))

    if isinstance(zstore, LocalStore):
        return [local_io.read_file(zstore.root, f"{path}/{n}/zarr.json") for n in names]
    raws = [None if b is None else b.to_bytes() for b in sync(_get())]
    for name, raw in zip(names, raws):
        if raw is not None and len(raw) > local_io.MAX_DOCUMENT_BYTES:
            raise StoreFormatError(f"array {name!r} of {path!r}: zarr.json holds {len(raw)} "
                                   f"bytes, more than {local_io.MAX_DOCUMENT_BYTES}")
    return raws


def read_metadata(zstore: Any, path: str, names: Sequence[str]) -> list[Any]:
    """The parsed ``zarr.json`` of each array ``path/name`` (None where missing)."""
    out = []
    for name, raw in zip(names, _read_raw_metadata(zstore, path, names)):
        if raw is None:
            out.append(None)
            continue
        try:
            out.append(json.loads(raw))
        except ValueError as e:
            raise StoreFormatError(f"array {name!r} of {path!r}: zarr.json is not JSON: {e}") from e
    return out


_LAYOUTS: dict[bytes, ArrayLayout] = {}
_LAYOUTS_MAX = 4096


def _layout(raw: bytes, where: str) -> ArrayLayout:
    """The validated layout of a ``zarr.json``; batches repeat the same documents, so a
    document already accepted is not parsed and checked again."""
    layout = _LAYOUTS.get(raw)
    if layout is None:
        try:
            doc = json.loads(raw)
        except ValueError as e:
            raise StoreFormatError(f"{where}: zarr.json is not JSON: {e}") from e
        layout = check_array_metadata(doc, where)
        if len(_LAYOUTS) >= _LAYOUTS_MAX:
            _LAYOUTS.clear()
        _LAYOUTS[raw] = layout
    return layout


def read_arrays(
    zstore: Any,
    path: str,
    where: str,
    keys: Sequence[str] | None = None,
    device: torch.device | str | None = None,
    url: str = "",
) -> dict[str, torch.Tensor]:
    """Read the arrays of the group ``path`` as ``{name: tensor}`` on ``device``.

    Every array's metadata is validated (:func:`check_array_metadata`) before any chunk is
    read.  ``where`` names the batch in messages.
    """
    dev = torch.device(device) if device is not None else torch.device("cpu")
    available = list_arrays(zstore, path) if keys is None else None
    names = list(keys) if keys is not None else available or []
    if keys is None and not names:
        raise BatchNotFoundError(f"batch data {path!r} is missing from {url!r}.")
    layouts: dict[str, ArrayLayout] = {}
    for name, raw in zip(names, _read_raw_metadata(zstore, path, names)):
        if raw is None:
            have = available if available is not None else list_arrays(zstore, path)
            if not have:
                raise BatchNotFoundError(f"batch data {path!r} is missing from {url!r}.")
            raise KeyError(f"batch {path!r} has no array {name!r}; it has {have}.")
        layouts[name] = _layout(raw, f"{where}, array {name!r}")
    pin = dev.type == "cuda" and torch.cuda.is_available()
    tensors = {name: empty_tensor(lay.shape, lay.dtype, pin) for name, lay in layouts.items()}
    jobs: list[tuple[str, str, ArrayLayout, np.ndarray, tuple[slice, ...]]] = []
    for name, lay in layouts.items():
        arr = tensors[name].numpy()
        for suffix, region in lay.chunks():
            jobs.append((name, f"{path}/{name}/{suffix}", lay, arr, region))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    try:
        if isinstance(zstore, LocalStore):
            _run_local(zstore.root, jobs, parallel=total >= _PARALLEL_BYTES)
        else:
            _run_remote(zstore, jobs, parallel=total >= _PARALLEL_BYTES)
    except _JobError as e:
        raise read_error(e, path, url) from e.args[2]
    if dev.type == "cpu":
        return tensors
    return {k: t.to(dev) for k, t in tensors.items()}


class _JobError(Exception):
    """``(array name, chunk key, error)`` of a chunk that could not be read."""


def read_error(e: _JobError, path: str, url: str) -> StoreError:
    """The error a reader raises for a chunk that failed."""
    name, key, err = e.args
    if isinstance(err, StoreFormatError):
        return StoreFormatError(f"cannot read array {name!r} of batch {path!r} in {url!r}: "
                                f"chunk {key!r}: {err}")
    if isinstance(err, ZipFormatError):
        return StoreFormatError(f"cannot read array {name!r} of batch {path!r} in {url!r}: "
                                f"chunk {key!r}: {err}. The container is corrupt or was modified.")
    if isinstance(err, ChunkError):
        return StoreError(
            f"cannot read array {name!r} of batch {path!r} in {url!r}: chunk {key!r}: "
            f"{err}. Restore the file from a copy, or delete the batch."
        )
    return StoreError(f"cannot read array {name!r} of batch {path!r} in {url!r}: chunk {key!r}: "
                      f"{type(err).__name__}: {err}")


def _dest(lay: ArrayLayout, arr: np.ndarray, region: tuple[slice, ...]) -> tuple[np.ndarray, bool]:
    """Where a chunk decodes to: the array's own memory when the chunk maps onto a contiguous
    block of it (chunks split the first axis only and the chunk is not a padded edge),
    else a scratch buffer to copy from."""
    full = all(s.stop - s.start == c for s, c in zip(region, lay.chunk_shape))
    if full and lay.chunk_shape[1:] == lay.shape[1:]:
        return arr[region], True
    return np.empty(lay.chunk_shape, lay.dtype), False


def _place(lay: ArrayLayout, arr: np.ndarray, region: tuple[slice, ...], buf: np.ndarray,
           direct: bool, found: bool) -> None:
    if not found:
        arr[region] = lay.fill_value
    elif not direct:
        arr[region] = buf[tuple(slice(0, s.stop - s.start) for s in region)]


def _run_local(root: Path, jobs: list[Any], parallel: bool) -> None:
    root = str(root)
    checked: set[str] = set()  # directories found to be real ones (no links), checked once
    for job in jobs:
        local_io.check_dirs(root, job[1], checked)

    def one(job: Any) -> None:
        name, key, lay, arr, region = job
        raw = lay.compressor is None and not lay.big_endian
        try:
            if raw and lay.chunk_shape[1:] == lay.shape[1:]:
                # chunks split the first axis only: the chunk's rows are one contiguous block
                dest = arr[region]
                if not _read_local(root, key, lay, dest, dest.nbytes, checked):
                    dest[...] = lay.fill_value
                return
            buf, direct = _dest(lay, arr, region)
            found = _read_local(root, key, lay, buf, buf.nbytes, checked)
        except Exception as e:
            raise _JobError(name, key, e) from e
        _place(lay, arr, region, buf, direct, found)

    _map(one, jobs, parallel)


def _run_remote(zstore: Any, jobs: list[Any], parallel: bool) -> None:
    proto = default_buffer_prototype()

    async def fetch() -> list[Any]:
        return await asyncio.gather(*(zstore.get(job[1], prototype=proto) for job in jobs),
                                    return_exceptions=True)

    blobs = sync(fetch())

    def one(pair: tuple[Any, Any]) -> None:
        job, blob = pair
        name, key, lay, arr, region = job
        if isinstance(blob, BaseException):
            raise _JobError(name, key, blob)
        buf, direct = _dest(lay, arr, region)
        if blob is not None:
            try:
                decode_chunk(blob.as_numpy_array(), lay, buf)
            except Exception as e:
                raise _JobError(name, key, e) from e
        _place(lay, arr, region, buf, direct, blob is not None)

    _map(one, list(zip(jobs, blobs)), parallel)


def _map(fn: Any, items: list[Any], parallel: bool) -> None:
    if not parallel or len(items) < 2:
        for item in items:
            fn(item)
        return
    for fut in [local_io.thread_pool("cpu").submit(fn, item) for item in items]:
        fut.result()


def array_nbytes(docs: Mapping[str, Any]) -> int:
    """Uncompressed bytes of validated array documents ``{name: zarr.json}``."""
    return sum(math.prod(d["shape"]) * np.dtype(d["data_type"]).itemsize for d in docs.values())
