"""The compiled local executor, for small batches: a read plan compiled once per directory
structure and arrays (runs of adjacent members, each one ``preadv`` whose buffers are the
arrays' own memory for raw chunks and one aside buffer for the rest), then run on every batch
of that structure with the batch's own CRC-32s."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from daskrl._checksums import crc32c
from daskrl.store._format import zip_container as zc
from daskrl.store._format import zip_read
from daskrl.store._format._limits import IOV_RUN, PARALLEL_BYTES
from daskrl.store._format.allowlist import ArrayLayout
from daskrl.store._format.chunks import ChunkError, check_crc32c_tail, decode_chunk
from daskrl.store._format.index import BatchIndex, memorize
from daskrl.store._format.read_local import preadv_exact
from daskrl.store._format.read_plan import (
    ChunkFailure,
    ChunkRead,
    ReadPlan,
    check_raw_size,
    plan_reads,
    scratch,
)

__all__ = ["Compiled", "compiled_plan", "read_compiled"]


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
class Compiled:
    """A read plan of one directory structure and arrays, compiled once for all its batches
    (its :class:`ChunkRead` ``crc`` fields are those of the first batch: the executor takes
    each batch's own)."""

    layouts: tuple[ArrayLayout, ...]
    plan: ReadPlan
    runs: list[_Run] | None
    """None: a large batch, read by the general executors."""


def compiled_plan(index: BatchIndex, names: Sequence[str]) -> Compiled:
    """The compiled plan of ``names`` (validated) of ``index``, from its structure's cache."""
    key = ("plan", tuple(names))
    lays = tuple(index.layouts[n] for n in names)
    hit = index.memo.get(key)
    if isinstance(hit, Compiled) and all(a is b for a, b in zip(hit.layouts, lays)):
        return hit
    plan = plan_reads(index, names)
    out = Compiled(lays, plan, _compile_runs(plan) if plan.nbytes < PARALLEL_BYTES else None)
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
                    check_raw_size(r)
                except Exception as e:
                    raise ChunkFailure(r, e) from e
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


def read_compiled(fd: int, runs: list[_Run], crcs: dict[str, int],
                   arrays: dict[str, np.ndarray]) -> None:
    """Execute compiled runs: one ``preadv`` per run, then every chunk checked (local header
    against the directory and this batch's CRC-32, the crc32c or zip CRC-32 of its bytes, a
    compressed chunk's decoded size) and compressed ones decoded into their arrays."""
    flat = {n: a.reshape(-1).view(np.uint8) for n, a in arrays.items()}
    for run in runs:
        aside = memoryview(bytearray(run.aside))
        iov = [aside[part] if name is None else flat[name][part] for name, part in run.pieces]
        try:
            preadv_exact(fd, iov, run.offset)
        except Exception as e:
            raise ChunkFailure(run.slots[0].read, e) from e
        for slot in run.slots:
            r = slot.read
            assert r.member is not None
            crc = crcs[r.member.name]
            try:
                zip_read.check_local_header(aside[slot.head], r.member, crc)
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
                    buf, direct = scratch(r, arr)
                    decode_chunk(data, r.layout, buf)
                    if not direct:
                        arr[r.region] = buf[tuple(slice(0, s.stop - s.start) for s in r.region)]
            except Exception as e:
                raise ChunkFailure(r, e) from e
