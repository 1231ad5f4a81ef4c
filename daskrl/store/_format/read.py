"""Read a batch's arrays: one planner (:func:`plan_reads`, named :class:`ChunkRead` records)
and two executors, local (``preadv`` on the source's file descriptor, straight into the
result arrays) and remote (one burst of :meth:`~._source.ByteSource.read_ranges`).

Every chunk is checked on the way: its local header against the central directory, its crc32c
(or, for chunks without one, the zip CRC-32), and its decoded size (:mod:`.chunks`).  An
uncompressed little-endian chunk whose rows are contiguous in the array is read into the array
itself (the kernel's copy is the only one; large ones block by block, each block checksummed
while in cache); others are decoded into the array or a scratch buffer.  A small batch's
adjacent chunks are read with one ``preadv`` per run; a large batch's chunks are read and
decoded by this process's thread pool.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from daskrl._checksums import crc32c
from daskrl.errors import BatchDataMissingError, StoreError, StoreFormatError
from daskrl.store._format import local_io
from daskrl.store._format import zip_container as zc
from daskrl.store._format._limits import (
    CRC_BLOCK,
    DEFAULT_LIMITS,
    IOV_RUN,
    PARALLEL_BYTES,
    ReadLimits,
)
from daskrl.store._format._source import ByteSource
from daskrl.store._format.allowlist import ArrayLayout
from daskrl.store._format.chunks import ChunkError, check_crc32c_tail, decode_chunk
from daskrl.store._format.index import BatchIndex, validate_arrays

__all__ = ["Allocate", "ChunkRead", "plan_reads", "read_batch"]

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


def read_batch(source: ByteSource, index: BatchIndex, names: Sequence[str] | None = None, *,
               limits: ReadLimits = DEFAULT_LIMITS,
               allocate: Allocate | None = None) -> dict[str, np.ndarray]:
    """Read the arrays ``names`` (default: all) of the container indexed by ``index``.

    Arrays not validated by :func:`~.index.read_index` are validated first.  ``allocate``
    makes the result arrays (default ``numpy.empty``; e.g. pinned memory for a GPU).  A chunk
    that fails its checks raises :class:`~daskrl.StoreError` (corrupt data) or
    :class:`~daskrl.StoreFormatError` (a malformed container) naming array and chunk.
    """
    if not index.arrays:
        raise BatchDataMissingError(f"{index.name}: the container holds no arrays.")
    names = index.arrays if names is None else list(names)
    if not names:  # asked for nothing (keys=[]): nothing to read
        return {}
    validate_arrays(source, index, names, limits)
    make = allocate or (lambda _name, shape, dtype: np.empty(shape, dtype))
    arrays = {n: make(n, index.layouts[n].shape, index.layouts[n].dtype) for n in names}
    plan = plan_reads(index, names)
    for r in plan.fills:
        arrays[r.array][r.region] = r.layout.fill_value
    parallel = plan.nbytes >= PARALLEL_BYTES
    fd = source.fileno()
    try:
        if fd is not None:
            _read_local(fd, plan.reads, arrays, parallel)
        else:
            _read_remote(source, index, plan.reads, arrays, parallel)
    except _ChunkFailure as e:
        raise _chunk_error(index.name, e.read, e.error) from e.error
    return arrays


class _ChunkFailure(Exception):
    def __init__(self, read: ChunkRead, error: BaseException) -> None:
        super().__init__(read.key)
        self.read, self.error = read, error


def _chunk_error(where: str, r: ChunkRead, err: BaseException) -> StoreError:
    what = f"cannot read array {r.array!r} of {where}: chunk {r.key!r}: {err}"
    if isinstance(err, zc.ZipFormatError):
        return StoreFormatError(f"{what}. The container is corrupt or was modified.")
    if isinstance(err, StoreFormatError):
        return StoreFormatError(what)
    if isinstance(err, ChunkError):
        return StoreError(f"{what}. Restore the file from a copy, or delete the batch.")
    return StoreError(f"cannot read array {r.array!r} of {where}: chunk {r.key!r}: "
                      f"{type(err).__name__}: {err}")


def _map(fn: Callable[[Any], None], items: Sequence[Any], parallel: bool) -> None:
    if not parallel or len(items) < 2:
        for item in items:
            fn(item)
        return
    for fut in [local_io.thread_pool("cpu").submit(fn, item) for item in items]:
        fut.result()


def _scratch(r: ChunkRead, arr: np.ndarray) -> tuple[np.ndarray, bool]:
    """Where a chunk decodes to: the array's own memory when the chunk is a contiguous block of
    it (chunks split the first axis only, not a padded edge), else a scratch buffer."""
    lay = r.layout
    full = all(s.stop - s.start == c for s, c in zip(r.region, lay.chunk_shape))
    if full and lay.chunk_shape[1:] == lay.shape[1:]:
        return arr[r.region], True
    return np.empty(lay.chunk_shape, lay.dtype), False


def _decode_into(r: ChunkRead, head: Any, data: np.ndarray, arr: np.ndarray) -> None:
    """Check a compressed (or byte-swapped, or scattered) chunk's header and checksum and
    decode it into its region of ``arr``."""
    assert r.member is not None
    zc.check_local_header(head, r.member, r.crc)
    if not r.layout.checksum and zc.crc32_update(data) != r.crc:
        raise ChunkError("zip CRC-32 mismatch: the chunk is corrupt or was modified")
    buf, direct = _scratch(r, arr)
    decode_chunk(data, r.layout, buf)
    if not direct:
        arr[r.region] = buf[tuple(slice(0, s.stop - s.start) for s in r.region)]


def _check_raw_size(r: ChunkRead) -> None:
    assert r.member is not None
    want = r.layout.chunk_nbytes + (4 if r.layout.checksum else 0)
    if r.member.size != want:
        raise ChunkError(f"chunk holds {r.member.size} bytes, expected {want}")


def _check_raw(r: ChunkRead, head: Any, dest: np.ndarray, rest: Any, computed: int) -> None:
    """Check a raw chunk read as header, data in place (``computed``: its checksum so far),
    and the rest (edge padding, crc32c)."""
    assert r.member is not None
    zc.check_local_header(head, r.member, r.crc)
    if r.layout.checksum:
        check_crc32c_tail(computed, rest)
    elif zc.crc32_update(rest, computed) != r.crc:
        raise ChunkError("zip CRC-32 mismatch: the chunk is corrupt or was modified")


# -- local executor ---------------------------------------------------------------------------
def _read_local(fd: int, reads: list[ChunkRead], arrays: dict[str, np.ndarray],
                parallel: bool) -> None:
    if parallel:
        def one(r: ChunkRead) -> None:
            try:
                if r.raw:
                    _read_raw_blocks(fd, r, arrays[r.array])
                else:
                    _read_runs(fd, [r], arrays)
            except _ChunkFailure:
                raise
            except Exception as e:
                raise _ChunkFailure(r, e) from e

        _map(one, reads, True)
        return
    _read_runs(fd, reads, arrays)


def _read_runs(fd: int, reads: list[ChunkRead], arrays: dict[str, np.ndarray]) -> None:
    """Read ``reads`` (sorted by offset) with one ``preadv`` per run of adjacent members: headers
    and checksums aside, raw data straight into the arrays."""
    i = 0
    while i < len(reads):
        run: list[tuple[ChunkRead, list[Any]]] = []  # (read, its buffers)
        iov: list[Any] = []
        j = i
        while j < len(reads) and (not run or (reads[j].offset == run[-1][0].offset
                                              + run[-1][0].length and len(iov) < IOV_RUN)):
            r = reads[j]
            assert r.member is not None
            head = bytearray(r.member.data_offset - r.member.offset)
            try:
                if r.raw:
                    _check_raw_size(r)
                    dest = arrays[r.array][r.region].reshape(-1).view(np.uint8)
                    bufs: list[Any] = [head, dest, bytearray(r.member.size - dest.nbytes)]
                else:
                    bufs = [head, np.empty(r.member.size, np.uint8)]
            except Exception as e:
                raise _ChunkFailure(r, e) from e
            run.append((r, bufs))
            iov.extend(bufs)
            j += 1
        try:
            _preadv_exact(fd, iov, reads[i].offset)
        except Exception as e:
            raise _ChunkFailure(reads[i], e) from e
        for r, bufs in run:
            try:
                if r.raw:
                    sum_ = crc32c if r.layout.checksum else zc.crc32_update
                    _check_raw(r, bufs[0], bufs[1], bufs[2], sum_(bufs[1], 0))
                else:
                    _decode_into(r, bufs[0], bufs[1], arrays[r.array])
            except Exception as e:
                raise _ChunkFailure(r, e) from e
        i = j


def _read_raw_blocks(fd: int, r: ChunkRead, arr: np.ndarray) -> None:
    """A raw chunk straight into its region of ``arr``, block by block (each block checksummed
    while still in cache); the rest (edge padding, crc32c) is read aside."""
    assert r.member is not None
    m = r.member
    _check_raw_size(r)
    dest = arr[r.region].reshape(-1).view(np.uint8)
    head = bytearray(m.data_offset - m.offset)
    valid = dest.nbytes
    sum_ = crc32c if r.layout.checksum else zc.crc32_update
    computed = n = 0
    _preadv_exact(fd, [head, dest[:CRC_BLOCK]], m.offset)
    zc.check_local_header(head, m, r.crc)
    while True:
        block = dest[n:n + CRC_BLOCK]
        if n:
            _preadv_exact(fd, [block], m.data_offset + n)
        computed = sum_(block, computed)
        n += block.nbytes
        if n >= valid:
            break
    rest = bytearray(m.size - valid)
    _preadv_exact(fd, [rest], m.data_offset + valid)
    if r.layout.checksum:
        check_crc32c_tail(computed, rest)
    elif zc.crc32_update(rest, computed) != r.crc:
        raise ChunkError("zip CRC-32 mismatch: the chunk is corrupt or was modified")


def _preadv_exact(fd: int, bufs: list[Any], offset: int) -> None:
    views = local_io.byte_views(bufs)
    want = sum(v.nbytes for v in views)
    got = os.preadv(fd, views, offset) if views else 0
    if got == want:
        return
    local_io.advance(views, got)
    offset += got
    while views:
        n = os.preadv(fd, views, offset)
        if n == 0:
            raise ChunkError("the container ends inside this chunk (truncated file)")
        offset += n
        local_io.advance(views, n)


# -- remote executor --------------------------------------------------------------------------
def _read_remote(source: ByteSource, index: BatchIndex, reads: list[ChunkRead],
                 arrays: dict[str, np.ndarray], parallel: bool) -> None:
    wanted = [r for r in reads if r.member is not None and index.cached(r.member) is None]
    try:
        got = source.read_ranges([(r.offset, r.length) for r in wanted])
    except zc.ZipFormatError as e:
        raise StoreFormatError(f"{index.name}: its zip container is not accepted: {e}") from None
    fetched = {r.key: data for r, data in zip(wanted, got)}

    def one(r: ChunkRead) -> None:
        assert r.member is not None
        try:
            raw = index.cached(r.member)
            if raw is None:
                raw = memoryview(fetched[r.key])
            head = r.member.data_offset - r.member.offset
            _decode_into(r, raw[:head], np.frombuffer(raw[head:], np.uint8), arrays[r.array])
        except Exception as e:
            raise _ChunkFailure(r, e) from e

    _map(one, reads, parallel)
