"""The local executor: a batch's chunks read with ``preadv`` on the container's file
descriptor, raw data straight into the result arrays (a large one block by block, each block
checksummed while in cache), the rest aside and decoded; in parallel on this process's thread
pool for a large batch."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from daskrl._checksums import crc32c
from daskrl.store._format import local_io, zip_read
from daskrl.store._format import zip_container as zc
from daskrl.store._format._limits import CRC_BLOCK, IOV_RUN
from daskrl.store._format.chunks import ChunkError, check_crc32c_tail
from daskrl.store._format.read_plan import (
    ChunkFailure,
    ChunkRead,
    check_raw,
    check_raw_size,
    decode_into,
    map_chunks,
)

__all__ = ["preadv_exact", "read_local"]


def read_local(fd: int, reads: list[ChunkRead], arrays: dict[str, np.ndarray],
                parallel: bool) -> None:
    if parallel:
        def one(r: ChunkRead) -> None:
            try:
                if r.raw:
                    _read_raw_blocks(fd, r, arrays[r.array])
                else:
                    _read_runs(fd, [r], arrays)
            except ChunkFailure:
                raise
            except Exception as e:
                raise ChunkFailure(r, e) from e

        map_chunks(one, reads, True)
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
                    check_raw_size(r)
                    dest = arrays[r.array][r.region].reshape(-1).view(np.uint8)
                    bufs: list[Any] = [head, dest, bytearray(r.member.size - dest.nbytes)]
                else:
                    bufs = [head, np.empty(r.member.size, np.uint8)]
            except Exception as e:
                raise ChunkFailure(r, e) from e
            run.append((r, bufs))
            iov.extend(bufs)
            j += 1
        try:
            preadv_exact(fd, iov, reads[i].offset)
        except Exception as e:
            raise ChunkFailure(reads[i], e) from e
        for r, bufs in run:
            try:
                if r.raw:
                    sum_ = crc32c if r.layout.checksum else zc.crc32_update
                    check_raw(r, bufs[0], bufs[1], bufs[2], sum_(bufs[1], 0))
                else:
                    decode_into(r, bufs[0], bufs[1], arrays[r.array])
            except Exception as e:
                raise ChunkFailure(r, e) from e
        i = j


def _read_raw_blocks(fd: int, r: ChunkRead, arr: np.ndarray) -> None:
    """A raw chunk straight into its region of ``arr``, block by block (each block checksummed
    while still in cache); the rest (edge padding, crc32c) is read aside."""
    assert r.member is not None
    m = r.member
    check_raw_size(r)
    dest = arr[r.region].reshape(-1).view(np.uint8)
    head = bytearray(m.data_offset - m.offset)
    valid = dest.nbytes
    sum_ = crc32c if r.layout.checksum else zc.crc32_update
    computed = n = 0
    preadv_exact(fd, [head, dest[:CRC_BLOCK]], m.offset)
    zip_read.check_local_header(head, m, r.crc)
    while True:
        block = dest[n:n + CRC_BLOCK]
        if n:
            preadv_exact(fd, [block], m.data_offset + n)
        computed = sum_(block, computed)
        n += block.nbytes
        if n >= valid:
            break
    rest = bytearray(m.size - valid)
    preadv_exact(fd, [rest], m.data_offset + valid)
    if r.layout.checksum:
        check_crc32c_tail(computed, rest)
    elif zc.crc32_update(rest, computed) != r.crc:
        raise ChunkError("zip CRC-32 mismatch: the chunk is corrupt or was modified")


def preadv_exact(fd: int, bufs: list[Any], offset: int) -> None:
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
