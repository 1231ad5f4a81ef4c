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
import math
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
from daskrl.store._format.index import BatchIndex, memorize, validate_arrays

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
    fd = source.fileno()
    try:
        compiled = _compiled(index, names) if fd is not None else None
        # a compiled plan's ChunkRead.crc are its first batch's: only _read_compiled (which
        # takes this batch's) may use it; the general executors get this batch's own plan
        plan = (compiled.plan if compiled is not None and compiled.runs is not None
                else plan_reads(index, names))
        for r in plan.fills:
            arrays[r.array][r.region] = r.layout.fill_value
        if fd is not None and compiled is not None and compiled.runs is not None:
            _read_compiled(fd, compiled.runs, index.crcs, arrays)
        elif fd is not None:
            _read_local(fd, plan.reads, arrays, plan.nbytes >= PARALLEL_BYTES)
        else:
            _read_remote(source, index, plan.reads, arrays, plan.nbytes >= PARALLEL_BYTES)
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


# -- compiled local executor (small batches) ---------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class _Slot:
    """One chunk of a compiled run: where its parts land."""

    read: ChunkRead
    head: slice
    """Its local header, in the run's aside buffer."""
    data: slice | None
    """Its stored bytes in the aside buffer; None for a raw chunk (read into the array)."""
    dest: slice
    """A raw chunk's bytes of the array's flat memory."""
    rest: slice
    """A raw chunk's bytes after its data (edge padding, crc32c), in the aside buffer."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Run:
    """Adjacent members read with one ``preadv``: raw chunks straight into their arrays,
    everything else (headers, compressed chunks, checksums) into one aside buffer."""

    offset: int
    aside: int
    pieces: list[tuple[str | None, slice]]
    """The ``preadv`` buffers in order: ``(None, slice of aside)`` or ``(array, bytes)``."""
    slots: list[_Slot]


@dataclasses.dataclass(frozen=True, slots=True)
class _Compiled:
    """A read plan of one directory structure and arrays, compiled once for all its batches
    (its :class:`ChunkRead` ``crc`` fields are those of the first batch: the executor takes
    each batch's own)."""

    layouts: tuple[ArrayLayout, ...]
    plan: ReadPlan
    runs: list[_Run] | None
    """None: a large batch, read by the general executors."""


def _compiled(index: BatchIndex, names: Sequence[str]) -> _Compiled:
    """The compiled plan of ``names`` (validated) of ``index``, from its structure's cache."""
    key = ("plan", tuple(names))
    lays = tuple(index.layouts[n] for n in names)
    hit = index.memo.get(key)
    if isinstance(hit, _Compiled) and all(a is b for a, b in zip(hit.layouts, lays)):
        return hit
    plan = plan_reads(index, names)
    out = _Compiled(lays, plan, _compile_runs(plan) if plan.nbytes < PARALLEL_BYTES else None)
    memorize(index.memo, key, out)
    return out


def _compile_runs(plan: ReadPlan) -> list[_Run]:
    runs: list[_Run] = []
    reads = plan.reads
    i = 0
    while i < len(reads):
        pieces: list[tuple[str | None, slice]] = []
        slots: list[_Slot] = []
        aside = 0
        n_iov = 0
        j = i
        end = reads[i].offset
        while j < len(reads) and reads[j].offset == end and n_iov < IOV_RUN:
            r = reads[j]
            assert r.member is not None
            m = r.member
            head = slice(aside, aside + m.data_offset - m.offset)
            if r.raw:
                try:
                    _check_raw_size(r)
                except Exception as e:
                    raise _ChunkFailure(r, e) from e
                lay = r.layout
                row = math.prod(lay.shape[1:]) * lay.dtype.itemsize
                dest = slice(r.region[0].start * row, r.region[0].stop * row)
                rest = slice(head.stop, head.stop + m.size - (dest.stop - dest.start))
                _extend(pieces, None, head)
                pieces.append((r.array, dest))
                pieces.append((None, rest))
                slots.append(_Slot(r, head, None, dest, rest))
                aside = rest.stop
            else:
                data = slice(head.stop, head.stop + m.size)
                _extend(pieces, None, slice(head.start, data.stop))
                slots.append(_Slot(r, head, data, slice(0, 0), slice(0, 0)))
                aside = data.stop
            n_iov = len(pieces)
            end = m.end
            j += 1
        runs.append(_Run(reads[i].offset, aside, pieces, slots))
        i = j
    return runs


def _extend(pieces: list[tuple[str | None, slice]], name: str | None, part: slice) -> None:
    """Append ``part`` of the aside buffer, merged with the piece before it when adjacent."""
    if pieces and pieces[-1][0] is None and name is None and pieces[-1][1].stop == part.start:
        pieces[-1] = (None, slice(pieces[-1][1].start, part.stop))
    else:
        pieces.append((name, part))


def _read_compiled(fd: int, runs: list[_Run], crcs: dict[str, int],
                   arrays: dict[str, np.ndarray]) -> None:
    """Execute compiled runs: one ``preadv`` per run, then every chunk checked (local header
    against the directory and this batch's CRC-32, the crc32c or zip CRC-32 of its bytes, a
    compressed chunk's decoded size) and compressed ones decoded into their arrays."""
    flat = {n: a.reshape(-1).view(np.uint8) for n, a in arrays.items()}
    for run in runs:
        aside = memoryview(bytearray(run.aside))
        iov = [aside[part] if name is None else flat[name][part] for name, part in run.pieces]
        try:
            _preadv_exact(fd, iov, run.offset)
        except Exception as e:
            raise _ChunkFailure(run.slots[0].read, e) from e
        for slot in run.slots:
            r = slot.read
            assert r.member is not None
            crc = crcs[r.member.name]
            try:
                zc.check_local_header(aside[slot.head], r.member, crc)
                if slot.data is None:
                    dest = flat[r.array][slot.dest]
                    rest = aside[slot.rest]
                    if r.layout.checksum:
                        check_crc32c_tail(crc32c(dest), rest)
                    elif zc.crc32_update(rest, zc.crc32_update(dest)) != crc:
                        raise ChunkError("zip CRC-32 mismatch: the chunk is corrupt or was "
                                         "modified")
                else:
                    data = np.frombuffer(aside[slot.data], np.uint8)
                    if not r.layout.checksum and zc.crc32_update(data) != crc:
                        raise ChunkError("zip CRC-32 mismatch: the chunk is corrupt or was "
                                         "modified")
                    arr = arrays[r.array]
                    buf, direct = _scratch(r, arr)
                    decode_chunk(data, r.layout, buf)
                    if not direct:
                        arr[r.region] = buf[tuple(slice(0, s.stop - s.start) for s in r.region)]
            except Exception as e:
                raise _ChunkFailure(r, e) from e


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
