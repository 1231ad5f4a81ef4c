"""A batch's index: its container's directory and its arrays' validated metadata.

:func:`read_index` reads the container's last bytes (one small read locally, one suffix request
remotely: a batch smaller than :data:`~._limits.REMOTE_TAIL_BYTES` arrives whole), then, before
any chunk is read, checks:

* the container (:mod:`.zip_container`: stored members only, no encryption, safe unique names,
  member extents inside the file and not overlapping);
* every member name: ``zarr.json``, ``<array>/zarr.json`` or a chunk key ``<array>/c...`` of an
  array that has a ``zarr.json`` (array names are identifiers, or since 2.2 paths of them and
  decimal indices, ``observation/desired_goal``, whose groups' ``zarr.json`` are never read);
* each requested array's ``zarr.json`` against the allowlist (:mod:`.allowlist`), and its chunk
  members: keys of its grid, none larger than a chunk of it can be (a missing chunk reads as
  fill);
* the arrays' decoded size against the file's and their number of chunks against the
  container's (:class:`~._limits.ReadLimits`), so that a small untrusted file cannot make the
  reader allocate or loop without bound.

Batches of one shape repeat the same directory (CRC-32 fields aside) and the same documents:
one bounded cache (:data:`_CACHE`) keeps what was parsed and accepted, so that reading many
batches parses each shape once.  Nothing unaccepted is ever cached.
"""

from __future__ import annotations

import dataclasses
import math
import re
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from daskrl._nested import valid_name
from daskrl.errors import ArrayNotFoundError, BatchDataMissingError, StoreFormatError
from daskrl.store._format import zip_container as zc
from daskrl.store._format import zip_read
from daskrl.store._format._limits import (
    DEFAULT_LIMITS,
    LOCAL_TAIL_BYTES,
    REMOTE_TAIL_BYTES,
    ReadLimits,
)
from daskrl.store._format._source import ByteSource
from daskrl.store._format.allowlist import ArrayLayout, parse_array_document

__all__ = ["MEMO_PER_STRUCTURE", "BatchIndex", "memorize", "read_index", "refuse"]

_DOT_CHUNK = re.compile(r"c(?:\.\d+)+")

_CACHE: dict[tuple[Any, ...], Any] = {}
"""The reader's one cache, bounded by :data:`_CACHE_MAX` entries (cleared when full): directory
structures by ``("directory", Directory, directory bytes with CRCs zeroed)`` and accepted array
layouts by ``("document", zarr.json bytes)``."""
_CACHE_MAX = 4096


@dataclasses.dataclass(frozen=True, slots=True)
class _Structure:
    """A checked directory's members by role (the same for every batch of one shape)."""

    members: list[zc.Member]
    names: list[str]
    """Member names in directory-entry order (the order of its CRC-32 fields)."""
    docs: dict[str, zc.Member]
    chunks: dict[str, dict[str, zc.Member]]
    largest: dict[str, zc.Member]
    memo: dict[Any, Any] = dataclasses.field(default_factory=dict)
    """What batches of this structure share, found once: its documents' layouts (by their
    bytes) and the reader's compiled read plans (:mod:`.read`); bounded (:func:`memorize`)."""


@dataclasses.dataclass
class BatchIndex:
    """A validated container: its members by array, the validated layouts of the arrays asked
    for so far, and the bytes already read."""

    name: str
    """The container, as messages name it (the source's name)."""
    size: int
    """Bytes of the container."""
    docs: dict[str, zc.Member]
    """Each array's ``zarr.json`` member."""
    chunks: dict[str, dict[str, zc.Member]]
    """Each array's chunk members by key suffix (``c/0/0``)."""
    crcs: dict[str, int]
    """Each member's CRC-32 by name."""
    largest: dict[str, zc.Member]
    """Each array's largest chunk member."""
    tail_offset: int
    tail: bytes
    """The container's last bytes, already read."""
    layouts: dict[str, ArrayLayout] = dataclasses.field(default_factory=dict)
    """Validated layouts of the arrays asked for (all of them unless ``names`` was given)."""
    memo: dict[Any, Any] = dataclasses.field(default_factory=dict)
    """What every batch of this directory structure shares (its structure's ``memo``)."""

    @property
    def arrays(self) -> list[str]:
        """Names of the container's arrays, sorted."""
        return sorted(self.docs)

    @property
    def chunk_bytes(self) -> int:
        """Bytes of all chunk data (what compression shrinks)."""
        return sum(m.size for c in self.chunks.values() for m in c.values())

    @property
    def decoded_bytes(self) -> int:
        """Bytes the validated arrays decode to."""
        return sum(math.prod(lay.shape) * lay.dtype.itemsize for lay in self.layouts.values())

    def cached(self, m: zc.Member) -> memoryview | None:
        """Header and data of member ``m`` if they lie in the bytes already read."""
        if m.offset >= self.tail_offset:
            return memoryview(self.tail)[m.offset - self.tail_offset:m.end - self.tail_offset]
        return None


def refuse(where: str, problem: str) -> StoreFormatError:
    """The error for a container outside what daskrl writes and reads."""
    return StoreFormatError(
        f"{where}: {problem}. daskrl reads only the uncompressed zip containers of store format "
        "2.x (stored members named zarr.json, <array>/zarr.json and <array>/c/...) and refuses "
        "anything else; this batch was not read. Was the store written by something other "
        "than daskrl?"
    )


def read_index(source: ByteSource, names: Sequence[str] | None = None, *,
               limits: ReadLimits = DEFAULT_LIMITS) -> BatchIndex:
    """The validated index of the container ``source``, with the layouts of its arrays
    ``names`` (default: all; ``[]`` validates the container alone); no chunk is read.

    Raises :class:`~daskrl.StoreFormatError` for anything outside the format or ``limits``,
    :class:`~daskrl.ArrayNotFoundError` for a name the batch does not have and
    :class:`~daskrl.BatchDataMissingError` when the container is gone.
    """
    where = source.name
    try:
        tail = source.tail(LOCAL_TAIL_BYTES if source.fileno() is not None else REMOTE_TAIL_BYTES)
        size = source.size()
    except FileNotFoundError:
        raise BatchDataMissingError(f"{where}: the container is missing.") from None
    try:
        d = zip_read.find_directory(tail, size - len(tail), size, limits.max_directory_bytes)
        tail_offset = size - len(tail)
        if d.offset >= tail_offset:
            cd: bytes | memoryview = memoryview(tail)[d.offset - tail_offset:d.offset - tail_offset + d.size]
        else:
            cd = source.read_ranges([(d.offset, d.size)])[0]
        structure, crcs = _structure(cd, d, where)
    except zc.ZipFormatError as e:
        raise refuse(where, f"its zip container is not accepted: {e}") from None
    index = BatchIndex(where, size, structure.docs, structure.chunks, crcs, structure.largest,
                       tail_offset, tail, memo=structure.memo)
    validate_arrays(source, index, index.arrays if names is None else names, limits)
    return index


def _structure(cd: bytes | memoryview, d: zip_read.Directory, where: str
               ) -> tuple[_Structure, dict[str, int]]:
    known = _CACHE.get(("crc positions", d))
    if isinstance(known, np.ndarray):
        # Where a directory of this extent had its CRC fields: if this one, so masked, is a
        # known structure, their bytes agree everywhere else, so its entries lie there too.
        view = np.frombuffer(cd, np.uint8)
        if view.size == d.size and (known.size == 0 or int(known[-1]) < view.size):
            masked = view.copy()
            masked[known] = 0
            hit = _CACHE.get(("directory", d, masked.tobytes()))
            if isinstance(hit, _Structure):
                return hit, dict(zip(hit.names, view[known].view("<u4").tolist()))
    masked_crcs = zip_read.mask_crcs(cd, d.count)
    key = ("directory", d, bytes(masked_crcs[0])) if masked_crcs is not None else None
    hit = _CACHE.get(key) if key is not None else None
    if isinstance(hit, _Structure) and masked_crcs is not None:
        return hit, dict(zip(hit.names, masked_crcs[1]))
    members, crcs = zip_read.parse_directory(cd, d)
    docs, chunks = _by_role(members, where)
    largest = {a: max(c.values(), key=lambda m: m.size) for a, c in chunks.items() if c}
    structure = _Structure(members, list(crcs), docs, chunks, largest)
    if key is not None:
        _remember(key, structure)
        _remember(("crc positions", d), _crc_positions(cd, d.count))
    return structure, crcs


def _crc_positions(cd: bytes | memoryview, count: int) -> np.ndarray:
    """Byte positions of the CRC-32 fields of a (parsed, valid) directory's entries."""
    view = memoryview(cd)
    starts = []
    pos = 0
    for _ in range(count):
        starts.append(pos + 16)
        nlen, xlen, clen = struct.unpack_from("<HHH", view, pos + 28)
        pos += zc.CENTRAL_HEADER.size + nlen + xlen + clen
    return (np.asarray(starts, np.int64)[:, None] + np.arange(4)).reshape(-1)


def _remember(key: tuple[Any, ...], value: Any) -> None:
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.clear()
    _CACHE[key] = value


def _by_role(members: list[zc.Member], where: str
             ) -> tuple[dict[str, zc.Member], dict[str, dict[str, zc.Member]]]:
    """Members by role: each array's ``zarr.json`` and its chunks; anything else is refused."""
    docs: dict[str, zc.Member] = {}
    chunks: dict[str, dict[str, zc.Member]] = {}
    for m in members:
        array, leaf = _split_member(m.name)
        if array is None or leaf is None or (array == "" and leaf != "zarr.json") or (
                array != "" and not valid_name(array)):
            raise refuse(where, f"unexpected zip member {_short(m.name)} (expected zarr.json, "
                                "<array>/zarr.json or <array>/c/<i>/..., an array being named "
                                "by identifiers and indices: observation, observation/goal, "
                                "observation/0)")
        if array == "":
            continue
        if leaf == "zarr.json":
            docs[array] = m
        else:
            chunks.setdefault(array, {})[leaf] = m
    for array in chunks:
        if array not in docs:
            raise refuse(where, f"zip members {sorted(chunks[array])[:3]} of array {array!r} "
                                "have no zarr.json")
    # A name with names under it (observation of observation/goal) is a group: its zarr.json
    # is never read, and it must have no chunks.
    groups = {"/".join(p[:i]) for p in (n.split("/") for n in docs) for i in range(1, len(p))}
    for g in groups & set(docs):
        if g in chunks:
            under = sorted(n for n in docs if n.startswith(g + "/"))
            raise refuse(where, f"array {g!r} has chunks and arrays under it ({under[:3]}): "
                                "a name is an array or a group, not both")
        del docs[g]
    return docs, chunks


def _split_member(name: str) -> tuple[str | None, str | None]:
    """``(array, leaf)`` of a member name: ``("observation/goal", "zarr.json")``, ``("reward",
    "c/0/0")``; ``("", "zarr.json")`` for the batch group's; ``(None, None)`` for anything
    else.  A chunk key is the last ``c`` followed by decimal components only (an array may be
    named ``c``: ``observation/c/c/0/0`` is a chunk of ``observation/c``)."""
    parts = name.split("/")
    last = parts[-1]
    if last == "zarr.json" or _DOT_CHUNK.fullmatch(last):
        return "/".join(parts[:-1]), last
    for j in range(len(parts) - 1, -1, -1):
        if parts[j] == "c":
            return "/".join(parts[:j]), "/".join(parts[j:])
        if not (parts[j].isascii() and parts[j].isdigit()):
            break
    return None, None


def _short(value: str) -> str:
    return repr(value) if len(value) <= 80 else repr(value[:77] + "...")


def validate_arrays(source: ByteSource, index: BatchIndex, names: Sequence[str],
                    limits: ReadLimits) -> None:
    """Add the layouts of arrays ``names`` to ``index``, each checked against the allowlist
    and, all together, against ``limits``."""
    where = index.name
    missing = [n for n in names if n not in index.docs]
    if missing:
        raise ArrayNotFoundError(f"{where} has no array {missing[0]!r}; it has {index.arrays}.")
    new = [n for n in names if n not in index.layouts]
    if not new:
        return  # every layout, and the bounds with them, checked when it was added
    members = [index.docs[n] for n in new]
    crcs = tuple(index.crcs[m.name] for m in members)
    region = _documents_region(index, members)
    seen = (index.memo.get(("documents", tuple(new), limits, region))
            if region is not None else None)
    if isinstance(seen, tuple) and seen[0] == crcs and not index.layouts:
        # The same documents (headers and data, byte for byte, and the directory's CRCs of
        # them) as a batch of this structure whose checks all passed under these limits: the
        # same layouts, bounds and chunk members (the structure and the file's size are the
        # same too).
        index.layouts.update(zip(new, seen[1]))
        return
    for name, raw in zip(new, _member_bytes(source, index, members, limits)):
        key = ("document", bytes(raw))
        lay = _CACHE.get(key)
        if not isinstance(lay, ArrayLayout):
            lay = parse_array_document(bytes(raw), f"{where}, array {name!r}")
            _remember(key, lay)
        index.layouts[name] = lay
    # bounds first: a small container must not make the reader allocate or loop without bound
    decoded = index.decoded_bytes
    if decoded > max(limits.free_bytes, limits.max_expansion * index.size):
        raise refuse(where, f"its arrays would decode to {decoded} bytes from a container of "
                            f"{index.size} bytes (more than {limits.max_expansion}x; "
                            f"{ReadLimits.how_to_raise('max_expansion')})")
    n_chunks = sum(math.prod(-(-n // c) for n, c in zip(lay.shape, lay.chunk_shape))
                   for lay in index.layouts.values())
    n_members = sum(len(c) for c in index.chunks.values())
    if n_chunks > max(limits.max_missing_chunks, 2 * n_members):
        raise refuse(where, f"its arrays have {n_chunks} chunks, the container {n_members} "
                            "chunk members (a grid of mostly absent chunks; "
                            f"{ReadLimits.how_to_raise('max_missing_chunks')})")
    for name in new:
        _check_members(index, name, index.layouts[name])
    if region is not None and len(index.layouts) == len(new):
        memorize(index.memo, ("documents", tuple(new), limits, region),
                 (crcs, tuple(index.layouts[n] for n in new)))


def _documents_region(index: BatchIndex, members: Sequence[zc.Member]) -> bytes | None:
    """The bytes from the first of ``members`` (local header included) to the end of the last,
    when the tail already read holds them (daskrl puts the documents there)."""
    if not members:
        return None
    lo = min(m.offset for m in members)
    hi = max(m.end for m in members)
    if lo < index.tail_offset or hi - lo > (64 << 10):
        return None
    return bytes(memoryview(index.tail)[lo - index.tail_offset:hi - index.tail_offset])


MEMO_PER_STRUCTURE = 32
"""Entries of a structure's ``memo`` at most (cleared when full)."""


def memorize(memo: dict[Any, Any], key: Any, value: Any) -> None:
    """``memo[key] = value``, clearing ``memo`` first when it is full."""
    if len(memo) >= MEMO_PER_STRUCTURE and key not in memo:
        memo.clear()
    memo[key] = value


def _check_members(index: BatchIndex, name: str, lay: ArrayLayout) -> None:
    members = index.chunks.get(name)
    big = index.largest.get(name)
    where = f"{index.name}, array {name!r}"
    if big is not None and big.size > lay.max_stored_bytes:
        raise refuse(where, f"zip member {big.name!r} holds {big.size} bytes; a chunk of this "
                            f"array holds at most {lay.max_stored_bytes}")
    if members and not lay.grid[1].issuperset(members):
        extra = sorted(set(members) - lay.grid[1])
        raise refuse(where, f"zip members {[f'{name}/{k}' for k in extra[:3]]} are not chunks "
                            f"of its grid (shape {list(lay.shape)}, chunks {list(lay.chunk_shape)})")


def _member_bytes(source: ByteSource, index: BatchIndex, members: Sequence[zc.Member],
                  limits: ReadLimits) -> list[memoryview]:
    """Data of small members (documents), local headers checked, zip CRC-32 verified."""
    where = index.name
    for m in members:
        if m.size > limits.max_document_bytes:
            raise refuse(where, f"zip member {m.name!r} holds {m.size} bytes; metadata "
                                f"documents hold at most {limits.max_document_bytes} "
                                f"({ReadLimits.how_to_raise('max_document_bytes')})")
    missing = [m for m in members if index.cached(m) is None]
    try:
        got = source.read_ranges([(m.offset, m.end - m.offset) for m in missing])
    except zc.ZipFormatError as e:
        raise refuse(where, f"its zip container is not accepted: {e}") from None
    fetched = dict(zip((m.name for m in missing), got))
    out = []
    for m in members:
        raw = index.cached(m)
        if raw is None:
            raw = memoryview(fetched[m.name])
        head = m.data_offset - m.offset
        try:
            zip_read.check_local_header(raw[:head], m, index.crcs[m.name])
        except zc.ZipFormatError as e:
            raise refuse(where, str(e)) from None
        data = raw[head:]
        if zc.crc32_update(data) != index.crcs[m.name]:
            raise StoreFormatError(f"{where}: zip member {m.name!r} fails its CRC-32: the "
                                   "container is corrupt or was modified.")
        out.append(data)
    return out
