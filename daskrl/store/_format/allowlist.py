"""The allowlist of array metadata: what a zarr v3 ``zarr.json`` may say for daskrl to read it.

A store may come from anywhere, so an array's metadata is checked before any of its data is
read: zarr format 3, a numeric or bool ``data_type``, a regular chunk grid with the default key
encoding, one null or distinct printable dimension name per dimension, and the codec chain
``bytes`` -> at most one of ``zstd``, ``blosc``, ``gzip`` -> optionally ``crc32c``.  Nothing
else is interpreted (no pickle, no object, string or structured dtypes, no unknown codecs or
extensions), so opening an untrusted store cannot run code; a refusal is a
:class:`~daskrl.StoreFormatError` naming the batch and array.  What passes becomes an
:class:`ArrayLayout`, all that the decoder (:mod:`.chunks`) and the planner need.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from daskrl.errors import StoreFormatError

__all__ = ["ALLOWED_CODECS", "ALLOWED_DATA_TYPES", "MAX_CHUNK_BYTES", "MAX_DIMENSION_NAME",
           "ArrayLayout", "check_array_metadata", "parse_array_document"]

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
MAX_DIMENSION_NAME = 255
"""Longest dimension name accepted (characters)."""
MAX_CHUNK_BYTES = 1 << 32
"""Largest decoded chunk accepted (4 GiB); daskrl writes chunks of at most 8 MiB per step."""
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
    _check_dimension_names(doc.get("dimension_names"), len(shape), where)
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


def _check_dimension_names(names: Any, ndim: int, where: str) -> None:
    """``dimension_names``: absent, or one entry per dimension, each null (format 2.0) or a
    distinct name of 1 to :data:`MAX_DIMENSION_NAME` printable characters (2.1 writes
    ``time``, ``env``, ``<array>_0``, ...)."""
    if names is None:
        return
    if not isinstance(names, list) or len(names) != ndim:
        raise _refuse(where, f"dimension_names {_short(names)} is not a list of {ndim} entries "
                             "(one per dimension)")
    strings = [n for n in names if n is not None]
    for n in strings:
        if not (isinstance(n, str) and 0 < len(n) <= MAX_DIMENSION_NAME and n.isprintable()):
            raise _refuse(where, f"dimension name {_short(n)} is not null or a string of 1 to "
                                 f"{MAX_DIMENSION_NAME} printable characters")
    if len(set(strings)) != len(strings):
        raise _refuse(where, f"dimension_names {_short(names)} repeat a name")


def _short(value: Any) -> str:
    """``repr(value)``, cut to 80 characters (an untrusted name may be long)."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


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


def parse_array_document(raw: bytes, where: str) -> ArrayLayout:
    """The :class:`ArrayLayout` of the ``zarr.json`` bytes ``raw`` (JSON, then the allowlist)."""
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise StoreFormatError(f"{where}: zarr.json is not JSON: {e}") from e
    return check_array_metadata(doc, where)
