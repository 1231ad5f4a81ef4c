"""Read a batch's arrays: one planner (:func:`~.read_plan.plan_reads`, named
:class:`~.read_plan.ChunkRead` records) and three executors: local (:mod:`.read_local`:
``preadv`` on the source's file descriptor, straight into the result arrays), compiled local
for small batches (:mod:`.read_compiled`), and remote (here: one burst of
:meth:`~._source.ByteSource.read_ranges`).

Every chunk is checked on the way: its local header against the central directory, its crc32c
(or, for chunks without one, the zip CRC-32), and its decoded size (:mod:`.chunks`).  An
uncompressed little-endian chunk whose rows are contiguous in the array is read into the array
itself (the kernel's copy is the only one; large ones block by block, each block checksummed
while in cache); others are decoded into the array or a scratch buffer.  A small batch's
adjacent chunks are read with one ``preadv`` per run; a large batch's chunks are read and
decoded by this process's thread pool.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from daskrl.errors import BatchDataMissingError, StoreError, StoreFormatError
from daskrl.store._format import zip_container as zc
from daskrl.store._format._limits import DEFAULT_LIMITS, PARALLEL_BYTES, ReadLimits
from daskrl.store._format._source import ByteSource
from daskrl.store._format.chunks import ChunkError
from daskrl.store._format.index import BatchIndex, validate_arrays
from daskrl.store._format.read_compiled import compiled_plan, read_compiled
from daskrl.store._format.read_local import read_local
from daskrl.store._format.read_plan import (
    Allocate,
    ChunkFailure,
    ChunkRead,
    decode_into,
    map_chunks,
    plan_reads,
)

__all__ = ["Allocate", "ChunkRead", "plan_reads", "read_batch"]


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
        compiled = compiled_plan(index, names) if fd is not None else None
        # a compiled plan's ChunkRead.crc are its first batch's: only read_compiled (which
        # takes this batch's) may use it; the general executors get this batch's own plan
        plan = (compiled.plan if compiled is not None and compiled.runs is not None
                else plan_reads(index, names))
        for r in plan.fills:
            arrays[r.array][r.region] = r.layout.fill_value
        if fd is not None and compiled is not None and compiled.runs is not None:
            read_compiled(fd, compiled.runs, index.crcs, arrays)
        elif fd is not None:
            read_local(fd, plan.reads, arrays, plan.nbytes >= PARALLEL_BYTES)
        else:
            _read_remote(source, index, plan.reads, arrays, plan.nbytes >= PARALLEL_BYTES)
    except ChunkFailure as e:
        raise _chunk_error(index.name, e.read, e.error) from e.error
    return arrays


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
            decode_into(r, raw[:head], np.frombuffer(raw[head:], np.uint8), arrays[r.array])
        except Exception as e:
            raise ChunkFailure(r, e) from e

    map_chunks(one, reads, parallel)
