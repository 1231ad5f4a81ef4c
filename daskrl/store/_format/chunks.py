"""Decode one stored chunk into its place, refusing frames that lie about their size.

The codecs of the allowlist (:mod:`.allowlist`) are decoded with numcodecs (zstd, blosc) and
zlib (gzip), each bounded by the chunk's decoded size: a zstd frame must declare its size, a
blosc header is checked field by field before c-blosc sees it, a gzip stream may not inflate
past the chunk.  A chunk's crc32c (when its codecs end with one) is verified first.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import numpy as np
from numcodecs import blosc as _blosc
from numcodecs import zstd as _zstd

from daskrl._checksums import crc32c
from daskrl._semaphores import release_semaphore_names
from daskrl.errors import StoreError
from daskrl.store._format.allowlist import ArrayLayout

__all__ = ["ChunkError", "check_blosc_header", "check_crc32c_tail", "decode_chunk"]


def _unname_blosc_mutex() -> None:
    """numcodecs' blosc keeps one ``multiprocessing.Lock`` per process, made on first use. In
    a process started by spawn or a forkserver (a Dask worker) that is a named semaphore, which
    the worker, killed with its resource tracker, would leave in ``/dev/shm``. Make it now and
    drop its name: no other process opens it by name (a forked child inherits it as it is)."""
    get_mutex = getattr(_blosc, "get_mutex", None)  # as in numcodecs 0.16; else `mutex`
    release_semaphore_names(get_mutex() if callable(get_mutex) else getattr(_blosc, "mutex", None))


_unname_blosc_mutex()


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


class ChunkError(StoreError, ValueError):
    """A chunk failed its checksum or does not decode to the chunk's size (the reader adds
    which batch, array and chunk)."""


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
    version, _, flags, typesize, nbytes, blocksize, cbytes = _BLOSC_HEADER.unpack_from(buf.data)
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
        _codec_decode(_zstd.decompress, "zstd", buf, out)
    elif layout.compressor == "blosc":
        check_blosc_header(buf, expected, layout)
        _codec_decode(_blosc.decompress, "blosc", buf, out)
    else:  # gzip, bounded so that a bomb cannot inflate past the chunk's size
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        raw = d.decompress(buf.tobytes(), expected + 1)
        if len(raw) != expected or not d.eof:
            raise ChunkError(f"gzip stream does not decode to exactly {expected} bytes")
        out.reshape(-1).view(np.uint8)[:] = np.frombuffer(raw, np.uint8)
    if layout.big_endian:
        out.byteswap(inplace=True)


def _codec_decode(decompress: Any, name: str, buf: np.ndarray, out: np.ndarray) -> None:
    """numcodecs' own decompressor (its codec classes' ``decode`` adds buffer checks to every
    call, a large share of decoding a small chunk; ``out`` is C-contiguous here)."""
    try:
        decompress(buf, out.reshape(-1).view(np.uint8))
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


def check_crc32c_tail(computed: int, rest: Any) -> None:
    """Check a chunk's crc32c: ``computed`` covers the chunk's bytes read so far, ``rest`` is
    what follows them (edge padding, then the stored crc32c)."""
    stored = int.from_bytes(bytes(rest[-4:]), "little")
    if len(rest) > 4:
        computed = crc32c(bytes(rest[:-4]), computed)
    if stored != computed:
        raise ChunkError(f"crc32c mismatch (stored {stored:#010x}, computed {computed:#010x}): "
                         "the chunk is corrupt or was modified")
