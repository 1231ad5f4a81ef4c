"""Encode a batch as the bytes of one zip container of store format 2.x.

A batch is a zarr v3 group: a ``zarr.json`` per array and one member per chunk, each chunk
passed through the codec chain ``bytes`` -> compressor -> ``crc32c``.  zarr-python's
array-creation path costs milliseconds of Python per array, a large share of a small batch's
rollout; this module writes exactly the bytes zarr-python would (checked byte for byte in the tests)
without it.  :func:`encode_batch` returns an :class:`EncodedBatch`: the members in archive
order (chunks first, then the documents, which then lie next to the central directory where a
reader's one read at the end finds both) and what a writer needs to put them in a file, whole
or member by member while their CRC-32s are computed.  Reading is :mod:`.index` and
:mod:`.read`.
"""


from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Hashable, Iterator, Mapping
from typing import Any

import numcodecs
import numpy as np

from daskrl._checksums import crc32c
from daskrl.errors import UnsupportedDtypeError
from daskrl.store._format import zip_container as zc
from daskrl.store._format import zip_write
from daskrl.store._format.codec_choice import CodecChoices
from daskrl.store._format.compression import Compression

__all__ = ["CHUNK_BYTES", "EncodedBatch", "chunk_rows", "dimension_names", "encode_array",
           "encode_batch", "group_document"]

CHUNK_BYTES = 8 << 20
"""Target size of one chunk before compression; chunks split the time axis only."""

_ZSTD = numcodecs.Zstd(level=1)
_LZ4 = numcodecs.Blosc(cname="lz4", clevel=1, shuffle=numcodecs.Blosc.SHUFFLE, blocksize=0)
_BLOSC_ZSTD = numcodecs.Blosc(cname="zstd", clevel=1, shuffle=numcodecs.Blosc.SHUFFLE,
                              blocksize=0)

_DTYPES = {"b": "bool", "i": "int", "u": "uint", "f": "float", "c": "complex"}


def group_document(attributes: dict[str, Any]) -> bytes:
    """``zarr.json`` of a group, on one line (json's C encoder: an indented document takes the
    slower pure-Python one, and every batch writes one)."""
    doc = {"zarr_format": 3, "node_type": "group", "attributes": attributes}
    return json.dumps(doc).encode()


_EMPTY_GROUP = group_document({})
"""``zarr.json`` of a group of a structure's arrays (``observation/`` of a Dict space)."""


def dimension_names(name: str, ndim: int, env_first: bool = False) -> list[str]:
    """The dimension names of array ``name`` with ``ndim`` dimensions (format 2.1): ``time``
    and ``env``, shared by every array, then ``<name>_0``, ``<name>_1``, ... of its own, so
    that arrays of different trailing sizes never share a dimension (xarray needs one size per
    name).  An array of a structure (2.2: ``observation/desired_goal``) has ``.`` for ``/`` in
    them: ``observation.desired_goal_0``.  An array ``[E, ...]`` (``env_first``: a recurrent
    policy's ``policy_state`` before a batch's first step) has no ``time``."""
    own = name.replace("/", ".")
    lead = ["env"] if env_first else ["time", "env"]
    return [*lead, *[f"{own}_{i}" for i in range(ndim - len(lead))]][:ndim]


def _env_first(name: str, attributes: Mapping[str, Any]) -> bool:
    """Whether array ``name`` of a batch with group ``attributes`` is ``[E, ...]``: the
    ``policy_state`` of a batch whose ``policy_state`` attribute is ``"first"``."""
    return attributes.get("policy_state") == "first" and name.split("/")[0] == "policy_state"


def chunk_rows(arr: np.ndarray, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Time steps per chunk: at most ``chunk_bytes`` (at least one step), balanced so that
    the chunks split ``T`` as evenly as possible (little or no padding in the edge chunk)."""
    row = max(1, arr[:1].nbytes)
    most = max(1, min(arr.shape[0], chunk_bytes // row))
    n = -(-arr.shape[0] // most) if arr.shape[0] else 1
    return max(1, -(-arr.shape[0] // n))


def _data_type(dtype: np.dtype) -> str:
    if dtype.kind not in _DTYPES:
        raise UnsupportedDtypeError(f"dtype {dtype} cannot be stored: numeric and bool dtypes "
                                    "only (convert the array, e.g. to float32 or uint8)")
    return "bool" if dtype.kind == "b" else dtype.name


_RAW = "none"
_ZSTD_SHUFFLE = "zstd-shuffle"
"""The codec a writer's choices use for ``zstd`` on elements of more than one byte: blosc's
zstd (level 1) after a byte shuffle, which groups the bytes of equal significance (ids, steps,
counts, sparse rewards: much smaller than plain zstd makes them, and faster to decode)."""


def _codecs(dtype: np.dtype, codec: str) -> list[dict[str, Any]]:
    byte_codec: dict[str, Any] = {"name": "bytes"}
    if dtype.itemsize > 1:
        byte_codec["configuration"] = {"endian": "little"}
    comp: list[dict[str, Any]] = []
    if codec == Compression.ZSTD:
        comp = [{"name": "zstd", "configuration": {"level": 1, "checksum": False}}]
    elif codec in (Compression.LZ4, _ZSTD_SHUFFLE):
        comp = [{"name": "blosc", "configuration": {
            "typesize": dtype.itemsize, "cname": "zstd" if codec == _ZSTD_SHUFFLE else "lz4",
            "clevel": 1, "shuffle": "shuffle", "blocksize": 0}}]
    return [byte_codec, *comp, {"name": "crc32c"}]


_ENCODERS = {Compression.ZSTD.value: _ZSTD, Compression.LZ4.value: _LZ4,
             _ZSTD_SHUFFLE: _BLOSC_ZSTD}


def _encode_chunk(chunk: np.ndarray, codec: str, pad_rows: int = 0) -> list[Any]:
    """A chunk's stored bytes as a list of buffers (written in order; joined they are the
    chunk).  Uncompressed data is not copied: its parts are views of ``chunk`` plus the zero
    padding of an edge chunk (``pad_rows`` rows) and the crc32c."""
    raw = np.ascontiguousarray(chunk, dtype=chunk.dtype.newbyteorder("<"))
    if pad_rows:
        pad = np.zeros((pad_rows, *raw.shape[1:]), raw.dtype)
        if codec != _RAW:
            raw = np.concatenate([raw, pad])
    if codec != _RAW:
        parts: list[Any] = [_ENCODERS[codec].encode(raw)]
    else:
        parts = [raw.reshape(-1).view(np.uint8)]
        if pad_rows:
            parts.append(pad.reshape(-1).view(np.uint8))
    crc = 0
    for i, part in enumerate(parts):
        buf = np.frombuffer(part, np.uint8) if not isinstance(part, np.ndarray) else part
        crc = crc32c(buf, crc if i else 0)
    parts.append(np.uint32(crc).astype("<u4").tobytes())
    return parts


@functools.lru_cache(maxsize=256)
def _array_document(name: str, shape: tuple[int, ...], dtype: np.dtype, rows: int,
                    codec: str, env_first: bool = False) -> bytes:
    chunk_shape = [rows, *shape[1:]]
    fill: Any = False if dtype.kind == "b" else (0.0 if dtype.kind in "fc" else 0)
    if dtype.kind == "c":
        fill = [0.0, 0.0]
    meta = {
        "shape": list(shape),
        "data_type": _data_type(dtype),
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunk_shape}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": fill,
        "codecs": _codecs(dtype, codec),
        "attributes": {},
        "dimension_names": dimension_names(name, len(shape), env_first),
        "zarr_format": 3,
        "node_type": "array",
        "storage_transformers": [],
    }
    return json.dumps(meta, indent=1).encode()


def _array_members(path: str, arr: np.ndarray, compression: Compression, chunk_bytes: int,
                   choices: CodecChoices | None = None, stream: Hashable = None,
                   env_first: bool = False) -> list[tuple[str, list[Any]]]:
    """``(member name, buffers)`` of the zarr v3 array ``path``: its ``zarr.json``, then its
    chunks; a member's content is its buffers joined.

    Without ``choices`` every chunk goes through ``compression``'s codec.  With a writer's
    ``choices``, ``zstd`` of elements wider than a byte is blosc's zstd after a byte shuffle
    (:data:`_ZSTD_SHUFFLE`), and an array whose compression saves too little is stored raw
    (``choices`` remembers that for the array's later batches in ``stream``)."""
    _data_type(arr.dtype)  # refuses what cannot be stored before any work
    rows = chunk_rows(arr, chunk_bytes)
    codec = Compression(compression).value
    if choices is not None and codec != _RAW:
        key = (stream, path, arr.dtype.str, arr.shape[1:], codec)
        if codec == Compression.ZSTD and arr.dtype.itemsize > 1:
            codec = _ZSTD_SHUFFLE
        if not choices.should_try(key):
            codec = _RAW
        else:
            chunks = _chunks(path, arr, codec, rows)
            stored = sum(len(parts[0]) for _, parts in chunks)
            raw = -(-arr.shape[0] // rows) * rows * arr[:1].nbytes if arr.shape[0] else 0
            if choices.judge(key, raw, stored):
                return [(f"{path}/zarr.json",
                         [_array_document(path, arr.shape, arr.dtype, rows, codec,
                                          env_first)]), *chunks]
            codec = _RAW
    doc = _array_document(path, arr.shape, arr.dtype, rows, codec, env_first)
    return [(f"{path}/zarr.json", [doc]), *_chunks(path, arr, codec, rows)]


def _chunks(path: str, arr: np.ndarray, codec: str, rows: int) -> list[tuple[str, list[Any]]]:
    tail = "/0" * (arr.ndim - 1)
    out = []
    for i, start in enumerate(range(0, arr.shape[0], rows)):
        chunk = arr[start:start + rows]
        # edge chunks are stored at full chunk shape, padded with zeros
        out.append((f"{path}/c/{i}{tail}", _encode_chunk(chunk, codec, rows - chunk.shape[0])))
    return out


def encode_array(path: str, arr: np.ndarray, compression: Compression,
                 chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[str, bytes]]:
    """Yield ``(key, bytes)`` of the zarr v3 array ``path``: its ``zarr.json``, then its chunks.

    The array is ``[T, E, ...]`` with the dimension names of :func:`dimension_names`; chunks
    split the time axis only, at most ``chunk_bytes`` each.
    """
    for key, parts in _array_members(path, arr, compression, chunk_bytes):
        yield key, b"".join(parts)


@dataclasses.dataclass(frozen=True)
class EncodedBatch:
    """A batch's container before it is written: ``(member name, buffers)`` in archive order
    (the buffers are the caller's arrays where uncompressed: nothing is copied)."""

    entries: list[tuple[str, list[Any]]]

    @functools.cached_property
    def plan(self) -> zip_write.Plan:
        """Where each member goes (offsets and sizes; raises :class:`~.zip_container.ZipFormatError`
        for a member of 4 GiB or more)."""
        return zip_write.plan_archive(self.entries)

    @property
    def nbytes(self) -> int:
        """Bytes of member data."""
        return sum(memoryview(p).nbytes for _, parts in self.entries for p in parts)

    def parts(self) -> list[Any]:
        """The whole container as buffers, in order (CRC-32s computed here)."""
        return zip_write.build_archive(self.entries).parts

    def member_crc(self, i: int) -> int:
        """ZIP CRC-32 of member ``i`` (releases the GIL: may run in a thread pool)."""
        return zc.crc32(self.entries[i][1])

    def data_pieces(self) -> list[tuple[int, list[Any]]]:
        """``(offset, buffers)`` of every member's data, writable before the CRC-32s are known."""
        return [(m.data_offset, parts)
                for m, (_, parts) in zip(self.plan.members, self.entries) if parts]

    def header_pieces(self, crcs: list[int]) -> list[tuple[int, list[Any]]]:
        """``(offset, buffers)`` of the local headers and the central directory, given every
        member's CRC-32."""
        plan = self.plan
        heads = [(m.offset, [plan.local_header(m, c)]) for m, c in zip(plan.members, crcs)]
        return [*heads, (plan.directory_offset, [plan.trailer(crcs)])]


def encode_batch(attributes: dict[str, Any], arrays: Mapping[str, np.ndarray],
                 compression: Compression, *, chunk_bytes: int = CHUNK_BYTES,
                 choices: CodecChoices | None = None, stream: Hashable = None) -> EncodedBatch:
    """The container of a batch group: every array's chunks first, then the documents (the
    arrays' ``zarr.json``, those of the groups of structured arrays (``observation/`` for
    ``observation/desired_goal``), and the batch group's, with ``attributes``).  Chunks hold at
    most ``chunk_bytes`` before compression.  Raises :class:`~daskrl.UnsupportedDtypeError` for
    an array that is not numeric or bool.

    ``choices`` (a writer's :class:`~.codec_choice.CodecChoices`) stores raw each array whose
    compression saves too little, decided per array of ``stream``; without it every array is
    compressed with ``compression``."""
    chunks: list[tuple[str, list[Any]]] = []
    docs: list[tuple[str, list[Any]]] = []
    groups: dict[str, None] = {}
    for name, arr in arrays.items():
        parts_of = name.split("/")
        for depth in range(1, len(parts_of)):
            groups["/".join(parts_of[:depth])] = None
        for key, parts in _array_members(name, arr, Compression(compression), chunk_bytes,
                                         choices, stream, _env_first(name, attributes)):
            (docs if key.endswith("zarr.json") else chunks).append((key, parts))
    group_docs = [(f"{g}/zarr.json", [_EMPTY_GROUP]) for g in groups]
    return EncodedBatch([*chunks, *docs, *group_docs,
                         ("zarr.json", [group_document(attributes)])])
