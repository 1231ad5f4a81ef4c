"""The read planner (:func:`plan_reads`: named :class:`ChunkRead` records) and what every
executor does with one chunk: check its header and checksum, decode it where it goes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from daskrl.store._format import local_io, zip_read
from daskrl.store._format import zip_container as zc
from daskrl.store._format.allowlist import ArrayLayout
from daskrl.store._format.chunks import ChunkError, check_crc32c_tail, decode_chunk
from daskrl.store._format.index import BatchIndex

__all__ = ["Allocate", "ChunkFailure", "ChunkRead", "ReadPlan", "check_raw", "check_raw_size",
           "decode_into", "map_chunks", "plan_reads", "scratch"]

Allocate = Callable[[str, tuple[int, ...], np.dtype], np.ndarray]
"""``(array name, shape, dtype) -> an uninitialized C-contiguous array`` to read into."""


@dataclasses.dataclass(frozen=True, slots=True)
class ChunkRead:
    """One chunk of one array: where its member lies and where it goes."""

    array: str
    key: str
    """The chunk's member name (``<array>/c/...``)."""
    layout: ArrayLayout
    region: tuple[slice, ...]
    """The chunk's region of the array (an edge chunk's is smaller than the chunk)."""
    member: zc.Member | None
    """None: the chunk is absent and reads as the fill value."""
    crc: int = 0
    """The member's zip CRC-32."""

    @property
    def offset(self) -> int:
        """Offset of the member's local header."""
        return self.member.offset if self.member is not None else 0

    @property
    def length(self) -> int:
        """Bytes of the member's local header and data."""
        return self.member.end - self.member.offset if self.member is not None else 0

    @property
    def raw(self) -> bool:
        """The stored bytes are the array's bytes: uncompressed, little endian, the chunk's rows
        contiguous in the array (chunks split the first axis only)."""
        lay = self.layout
        return lay.compressor is None and not lay.big_endian and lay.chunk_shape[1:] == lay.shape[1:]


@dataclasses.dataclass(frozen=True, slots=True)
class ReadPlan:
    """The chunks to read (sorted by offset) and those to fill, and the bytes they decode to."""

    reads: list[ChunkRead]
    fills: list[ChunkRead]
    nbytes: int


def plan_reads(index: BatchIndex, names: Sequence[str]) -> ReadPlan:
    """Every chunk of the validated arrays ``names`` of ``index``, as :class:`ChunkRead`."""
    reads: list[ChunkRead] = []
    fills: list[ChunkRead] = []
    nbytes = 0
    for name in names:
        lay = index.layouts[name]
        nbytes += lay.dtype.itemsize * int(np.prod(lay.shape))
        members = index.chunks.get(name, {})
        for suffix, region in lay.grid[0]:
            m = members.get(suffix)
            r = ChunkRead(name, f"{name}/{suffix}", lay, region, m,
                          index.crcs[m.name] if m is not None else 0)
            (reads if m is not None else fills).append(r)
    reads.sort(key=lambda r: r.offset)
    return ReadPlan(reads, fills, nbytes)


class ChunkFailure(Exception):
    """A chunk that failed a read or a check, and why (turned into the store's error by
    :func:`~.read.read_batch`)."""

    def __init__(self, read: ChunkRead, error: BaseException) -> None:
        super().__init__(read.key)
        self.read, self.error = read, error


def map_chunks(fn: Callable[[Any], None], items: Sequence[Any], parallel: bool) -> None:
    if not parallel or len(items) < 2:
        for item in items:
            fn(item)
        return
    for fut in [local_io.thread_pool("cpu").submit(fn, item) for item in items]:
        fut.result()


def scratch(r: ChunkRead, arr: np.ndarray) -> tuple[np.ndarray, bool]:
    """Where a chunk decodes to: the array's own memory when the chunk is a contiguous block of
    it (chunks split the first axis only, not a padded edge), else a scratch buffer."""
    lay = r.layout
    full = all(s.stop - s.start == c for s, c in zip(r.region, lay.chunk_shape))
    if full and lay.chunk_shape[1:] == lay.shape[1:]:
        return arr[r.region], True
    return np.empty(lay.chunk_shape, lay.dtype), False


def decode_into(r: ChunkRead, head: Any, data: np.ndarray, arr: np.ndarray) -> None:
    """Check a compressed (or byte-swapped, or scattered) chunk's header and checksum and
    decode it into its region of ``arr``."""
    assert r.member is not None
    zip_read.check_local_header(head, r.member, r.crc)
    if not r.layout.checksum and zc.crc32_update(data) != r.crc:
        raise ChunkError("zip CRC-32 mismatch: the chunk is corrupt or was modified")
    buf, direct = scratch(r, arr)
    decode_chunk(data, r.layout, buf)
    if not direct:
        arr[r.region] = buf[tuple(slice(0, s.stop - s.start) for s in r.region)]


def check_raw_size(r: ChunkRead) -> None:
    assert r.member is not None
    want = r.layout.chunk_nbytes + (4 if r.layout.checksum else 0)
    if r.member.size != want:
        raise ChunkError(f"chunk holds {r.member.size} bytes, expected {want}")


def check_raw(r: ChunkRead, head: Any, dest: np.ndarray, rest: Any, computed: int) -> None:
    """Check a raw chunk read as header, data in place (``computed``: its checksum so far),
    and the rest (edge padding, crc32c)."""
    assert r.member is not None
    zip_read.check_local_header(head, r.member, r.crc)
    if r.layout.checksum:
        check_crc32c_tail(computed, rest)
    elif zc.crc32_update(rest, computed) != r.crc:
        raise ChunkError("zip CRC-32 mismatch: the chunk is corrupt or was modified")
