"""Read a format 2.x batch, one zip container, into torch tensors, refusing anything unexpected.

The container's central directory (at the end of the file) is read first, with the array
documents that daskrl writes just before it, in one small read (local files) or one suffix
request (fsspec stores: a batch smaller than :data:`REMOTE_TAIL_BYTES` arrives whole).  Then,
before any chunk is read:

* the container is validated (:mod:`daskrl.store._format.zip_container`: stored members only, no encryption,
  safe unique names, member extents inside the file and not overlapping);
* every member name must be ``zarr.json``, ``<array>/zarr.json`` or a chunk key
  ``<array>/c...`` of an array that has a ``zarr.json`` (array names are identifiers);
* each requested array's ``zarr.json`` passes the allowlist of :mod:`daskrl.store._format.zarr_decode`, and
  its chunk members are exactly chunk keys of its grid (a missing chunk reads as fill);
* the arrays' decoded size is bounded by the file's size (:data:`MAX_EXPANSION`) and their
  number of chunks by the container's (:data:`MAX_MISSING_CHUNKS`), so that a small untrusted
  file cannot make the reader allocate or loop without bound.

Chunks are then read straight into the result tensors: locally with ``preadv`` at the member's
offset (its local header checked in the same call, the crc32c verified block by block), remotely
with one concurrent burst of range requests.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from zarr.abc.store import RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import LocalStore

from daskrl._checksums import crc32c
from daskrl.errors import BatchNotFoundError, StoreFormatError
from daskrl.store._format import local_io
from daskrl.store._format import zip_container as zc
from daskrl.store._format.zarr_decode import (
    _CRC_BLOCK,
    _PARALLEL_BYTES,
    ArrayLayout,
    ChunkError,
    _dest,
    _JobError,
    _layout,
    _map,
    _place,
    decode_chunk,
    empty_tensor,
    read_error,
)

__all__ = ["MAX_DOCUMENT_BYTES", "MAX_EXPANSION", "MAX_MISSING_CHUNKS", "REMOTE_TAIL_BYTES", "BatchIndex",
           "read_index", "read_zip_arrays"]

LOCAL_TAIL_BYTES = 32 << 10
"""Bytes read from the end of a local container to find its directory and documents."""
REMOTE_TAIL_BYTES = 1 << 20
"""Bytes asked for from the end of a remote container (smaller containers arrive whole)."""
MAX_DOCUMENT_BYTES = 1 << 20
"""Largest ``zarr.json`` member accepted (daskrl writes under 1 KiB)."""
MAX_EXPANSION = 1024
"""A batch's arrays may decode to at most ``max(1 GiB, MAX_EXPANSION * file size)`` bytes."""
_FREE_BYTES = 1 << 30
MAX_MISSING_CHUNKS = 1 << 16
"""A batch's arrays may have at most ``max(MAX_MISSING_CHUNKS, 2 * chunk members)`` chunks."""
_MEMBER = re.compile(r"(?:([^/]+)/)?(zarr\.json|c(?:/\d+)*|c(?:\.\d+)+)")


@dataclasses.dataclass
class BatchIndex:
    """A validated container: its members by array, and the bytes already read."""

    size: int
    """Bytes of the container."""
    docs: dict[str, zc.Member]
    """Each array's ``zarr.json`` member."""
    chunks: dict[str, dict[str, zc.Member]]
    """Each array's chunk members by key suffix (``c/0/0``)."""
    crcs: dict[str, int]
    """Each member's CRC-32 by name."""
    tail_offset: int
    tail: bytes
    """The container's last bytes, already read."""
    largest: dict[str, zc.Member] = dataclasses.field(default_factory=dict)
    """Each array's largest chunk member."""
    size_known: bool = True
    """:attr:`size` is the file's (local, or a remote object read whole), not only what the
    end records claim (a large remote object)."""

    def cached(self, m: zc.Member) -> memoryview | None:
        """Header and data of member ``m`` if they lie in the bytes already read."""
        if m.offset >= self.tail_offset:
            return memoryview(self.tail)[m.offset - self.tail_offset:m.end - self.tail_offset]
        return None

    @property
    def chunk_bytes(self) -> int:
        """Bytes of all chunk data (what compression shrinks)."""
        return sum(m.size for c in self.chunks.values() for m in c.values())


class _Local:
    """A container in a local file, read with ``pread``."""

    def __init__(self, root: str, key: str, checked: set[str] | None = None) -> None:
        # a regular file inside the store: no link out of it, no FIFO to block on
        self.fd = local_io.open_regular(root, key, checked)
        self.size = os.fstat(self.fd).st_size

    def tail(self) -> tuple[int | None, bytes]:
        n = min(self.size, LOCAL_TAIL_BYTES)
        return self.size - n, self.read(self.size - n, self.size)

    def read(self, start: int, end: int) -> bytes:
        data = os.pread(self.fd, end - start, start)
        if len(data) != end - start:
            raise zc.ZipFormatError(f"bytes {start}..{end} lie past the end of the file")
        return data

    def read_many(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return [self.read(a, b) for a, b in ranges]

    def close(self) -> None:
        os.close(self.fd)


class _Remote:
    """A container in an fsspec (or other zarr) store, read with range requests."""

    def __init__(self, zstore: Any, key: str) -> None:
        self.zstore, self.key = zstore, key
        self.size: int | None = None
        self.proto = default_buffer_prototype()

    def tail(self) -> tuple[int | None, bytes]:
        buf = sync(self.zstore.get(self.key, self.proto, SuffixByteRequest(REMOTE_TAIL_BYTES)))
        if buf is None:
            raise FileNotFoundError(self.key)
        data = buf.to_bytes()
        if len(data) < REMOTE_TAIL_BYTES:  # the whole object: its size is known
            self.size = len(data)
            return 0, data
        return None, data

    def read_many(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        if not ranges:
            return []
        bufs = sync(self.zstore.get_partial_values(
            self.proto, [(self.key, RangeByteRequest(a, b)) for a, b in ranges]))
        out = []
        for (a, b), buf in zip(ranges, bufs):
            data = b"" if buf is None else buf.to_bytes()
            if len(data) != b - a:
                raise zc.ZipFormatError(f"bytes {a}..{b} lie past the end of the object")
            out.append(data)
        return out

    def read(self, start: int, end: int) -> bytes:
        return self.read_many([(start, end)])[0]

    def close(self) -> None:
        pass


def _refuse(where: str, problem: str) -> StoreFormatError:
    return StoreFormatError(
        f"{where}: {problem}. daskrl reads only the uncompressed zip containers of store format "
        "2.x (stored members named zarr.json, <array>/zarr.json and <array>/c/...) and refuses "
        "anything else; this batch was not read. Was the store written by something other "
        "than daskrl?"
    )


def _open(zstore: Any, path: str, url: str, checked: set[str] | None = None) -> Any:
    try:
        if isinstance(zstore, LocalStore):
            return _Local(str(zstore.root), path, checked)
        return _Remote(zstore, path)
    except (FileNotFoundError, NotADirectoryError):
        raise BatchNotFoundError(f"batch data {path!r} is missing from {url!r}.") from None
    except local_io.UnsafeFileError as e:
        raise local_io.UnsafeFileError(f"store {url!r}: {e}; the batch was not read") from None


def _build_index(src: Any, where: str, path: str, url: str) -> BatchIndex:
    try:
        tail_offset, tail = src.tail()
    except FileNotFoundError:
        raise BatchNotFoundError(f"batch data {path!r} is missing from {url!r}.") from None
    try:
        d = zc.find_directory(tail, tail_offset, src.size)
        tail_offset = d.archive_size - len(tail)
        if d.offset >= tail_offset:
            cd = memoryview(tail)[d.offset - tail_offset:d.offset - tail_offset + d.size]
        else:
            cd = memoryview(src.read(d.offset, d.offset + d.size))
        members, crcs = zc.parse_directory(cd, d)
    except zc.ZipFormatError as e:
        raise _refuse(where, f"its zip container is not accepted: {e}") from None
    cached = _STRUCTURES.get(id(members))
    if cached is not None and cached[0] is members:  # a directory already checked
        docs, chunks, largest = cached[1], cached[2], cached[3]
    else:
        docs, chunks = _structure(members, where)
        largest = {a: max(c.values(), key=lambda m: m.size) for a, c in chunks.items() if c}
        if len(_STRUCTURES) >= 256:
            _STRUCTURES.clear()
        _STRUCTURES[id(members)] = (members, docs, chunks, largest)
    return BatchIndex(d.archive_size, docs, chunks, crcs, tail_offset, tail, largest,
                      src.size is not None)


_KNOWN_DOCS: dict[tuple[int, int], ArrayLayout] = {}
"""Layouts of array documents read and accepted, by ``(size, CRC-32)``.  A document whose
directory entry matches one is not read again: its bytes are the accepted document (or, were a
CRC-32 forged, bytes never interpreted, since the accepted layout is used)."""

_STRUCTURES: dict[int, tuple[list[zc.Member], dict[str, zc.Member], dict[str, dict[str, zc.Member]],
                             dict[str, zc.Member]]] = {}


def _structure(members: list[zc.Member], where: str
               ) -> tuple[dict[str, zc.Member], dict[str, dict[str, zc.Member]]]:
    """Members by role: each array's ``zarr.json`` and its chunks; anything else is refused."""
    docs: dict[str, zc.Member] = {}
    chunks: dict[str, dict[str, zc.Member]] = {}
    for m in members:
        match = _MEMBER.fullmatch(m.name)
        array, leaf = match.groups() if match else (None, None)
        if match is None or (array is None and leaf != "zarr.json") or (
                array is not None and not array.isidentifier()):
            raise _refuse(where, f"unexpected zip member {m.name!r} (expected zarr.json, "
                                 "<array>/zarr.json or <array>/c/<i>/...)")
        if array is None:
            continue
        if leaf == "zarr.json":
            docs[array] = m
        else:
            chunks.setdefault(array, {})[leaf] = m
    for array in chunks:
        if array not in docs:
            raise _refuse(where, f"zip members {sorted(chunks[array])[:3]} of array {array!r} "
                                 "have no zarr.json")
    return docs, chunks


def _member_bytes(src: Any, index: BatchIndex, members: Sequence[zc.Member],
                  where: str) -> list[memoryview]:
    """Data of small members (documents), local headers checked, zip CRC-32 verified."""
    for m in members:
        if m.size > MAX_DOCUMENT_BYTES:
            raise _refuse(where, f"zip member {m.name!r} holds {m.size} bytes; metadata "
                                 f"documents hold at most {MAX_DOCUMENT_BYTES}")
    missing = [m for m in members if index.cached(m) is None]
    fetched = dict(zip((m.name for m in missing),
                       src.read_many([(m.offset, m.end) for m in missing])))
    out = []
    for m in members:
        raw = index.cached(m)
        if raw is None:
            raw = memoryview(fetched[m.name])
        head = m.data_offset - m.offset
        try:
            zc.check_local_header(raw[:head], m, index.crcs[m.name])
        except zc.ZipFormatError as e:
            raise _refuse(where, str(e)) from None
        data = raw[head:]
        if zc.crc32_update(data) != index.crcs[m.name]:
            raise StoreFormatError(f"{where}: zip member {m.name!r} fails its CRC-32: the "
                                   "container is corrupt or was modified.")
        out.append(data)
    return out


def _layouts(src: Any, index: BatchIndex, names: Sequence[str], where: str,
             path: str) -> dict[str, ArrayLayout]:
    missing = [n for n in names if n not in index.docs]
    if missing:
        raise KeyError(f"batch {path!r} has no array {missing[0]!r}; it has {sorted(index.docs)}.")
    found: dict[str, ArrayLayout] = {}
    for name in names:  # documents seen before (same size and CRC-32) need not be read
        m = index.docs[name]
        lay = _KNOWN_DOCS.get((m.size, index.crcs[m.name]))
        if lay is not None:
            found[name] = lay
    unknown = [n for n in names if n not in found]
    raws = _member_bytes(src, index, [index.docs[n] for n in unknown], where) if unknown else []
    for name, raw in zip(unknown, raws):
        m = index.docs[name]
        found[name] = _layout(bytes(raw), f"{where}, array {name!r}")
        if len(_KNOWN_DOCS) >= 4096:
            _KNOWN_DOCS.clear()
        _KNOWN_DOCS[(m.size, index.crcs[m.name])] = found[name]
    layouts = {n: found[n] for n in names}
    # bounds first: a small container must not make the reader allocate or loop without bound
    if index.size_known:  # else checked against the bytes fetched (read_zip_arrays)
        _check_expansion(layouts, index.size, where)
    n_chunks = sum(math.prod(-(-n // c) for n, c in zip(lay.shape, lay.chunk_shape))
                   for lay in layouts.values())
    n_members = sum(len(c) for c in index.chunks.values())
    if n_chunks > max(MAX_MISSING_CHUNKS, 2 * n_members):
        raise _refuse(where, f"its arrays have {n_chunks} chunks, the container {n_members} "
                             "chunk members (a grid of mostly absent chunks)")
    for name, lay in layouts.items():
        members = index.chunks.get(name)
        big = index.largest.get(name)
        if big is not None and big.size > lay.max_stored_bytes:
            raise _refuse(f"{where}, array {name!r}",
                          f"zip member {big.name!r} holds {big.size} bytes; a chunk of this "
                          f"array holds at most {lay.max_stored_bytes}")
        if members and not lay.grid[1].issuperset(members):
            extra = sorted(set(members) - lay.grid[1])
            raise _refuse(f"{where}, array {name!r}",
                          f"zip members {[f'{name}/{k}' for k in extra[:3]]} are not chunks "
                          f"of its grid (shape {list(lay.shape)}, chunks {list(lay.chunk_shape)})")
    return layouts


def _check_expansion(layouts: dict[str, ArrayLayout], size: int, where: str) -> None:
    decoded = sum(math.prod(lay.shape) * lay.dtype.itemsize for lay in layouts.values())
    if decoded > max(_FREE_BYTES, MAX_EXPANSION * size):
        raise _refuse(where, f"its arrays would decode to {decoded} bytes from a container of "
                             f"{size} bytes (more than {MAX_EXPANSION}x; if this store "
                             "is trusted, raise daskrl.store._format.zip_decode.MAX_EXPANSION)")


def read_index(zstore: Any, path: str, where: str, url: str = "",
               keys: Sequence[str] | None = None) -> tuple[BatchIndex, dict[str, ArrayLayout]]:
    """The validated index of the container ``path`` and the layouts of its arrays ``keys``
    (default: all), every document checked against the allowlist; no chunk is read."""
    src = _open(zstore, path, url)
    try:
        index = _build_index(src, where, path, url)
        names = sorted(index.docs) if keys is None else list(keys)
        return index, _layouts(src, index, names, where, path)
    finally:
        src.close()


def read_zip_arrays(
    zstore: Any,
    path: str,
    where: str,
    keys: Sequence[str] | None = None,
    device: torch.device | str | None = None,
    url: str = "",
    checked: set[str] | None = None,
) -> dict[str, torch.Tensor]:
    """Read the arrays of the container ``path`` as ``{name: tensor}`` on ``device``.

    The container and every requested array's metadata are validated before any chunk is
    read; ``where`` names the batch in messages.  ``checked``: directories of the store already
    found to be real ones (see :func:`daskrl.store._format.local_io.check_dirs`).
    """
    dev = torch.device(device) if device is not None else torch.device("cpu")
    src = _open(zstore, path, url, checked)
    try:
        index = _build_index(src, where, path, url)
        names = sorted(index.docs) if keys is None else list(keys)
        if not names:
            raise BatchNotFoundError(f"batch data {path!r} in {url!r} holds no arrays.")
        layouts = _layouts(src, index, names, where, path)
        fetched = None
        if not index.size_known:
            # A large remote object: its size is what its end records claim.  Fetch the chunks
            # first (a range past the object's real end comes back short: refused), then bound
            # the arrays by the bytes that really exist, before allocating them.
            wanted = [m for n in names for m in index.chunks.get(n, {}).values()
                      if index.cached(m) is None]
            fetched = _fetch(src, wanted, where)
            _check_expansion(layouts, len(index.tail) + sum(m.end - m.offset for m in wanted),
                             where)
        pin = dev.type == "cuda" and torch.cuda.is_available()
        tensors = {n: empty_tensor(lay.shape, lay.dtype, pin) for n, lay in layouts.items()}
        jobs = []
        for name, lay in layouts.items():
            arr = tensors[name].numpy()
            members = index.chunks.get(name, {})
            for suffix, region in lay.grid[0]:
                jobs.append((name, f"{name}/{suffix}", lay, arr, region, members.get(suffix)))
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        try:
            if not isinstance(src, _Local):
                _remote_jobs(src, index, jobs, total >= _PARALLEL_BYTES, fetched)
            elif total >= _PARALLEL_BYTES:
                _map(lambda job: _local_job(src.fd, index.crcs, job), jobs, True)
            else:
                _local_small(src.fd, index.crcs, jobs)
        except _JobError as e:
            raise read_error(e, path, url) from e.args[2]
    finally:
        src.close()
    if dev.type == "cpu":
        return tensors
    return {k: t.to(dev) for k, t in tensors.items()}


def _verify_zip_crc(data: Any, crc: int) -> None:
    if zc.crc32_update(data) != crc:
        raise ChunkError("zip CRC-32 mismatch: the chunk is corrupt or was modified")


def _direct(lay: ArrayLayout) -> bool:
    """Chunks of ``lay`` are read straight into the array: uncompressed, little endian, and
    split along the first axis only (each chunk's rows are one contiguous block)."""
    return lay.compressor is None and not lay.big_endian and lay.chunk_shape[1:] == lay.shape[1:]


def _local_job(fd: int, crcs: dict[str, int], job: Any) -> None:
    name, key, lay, arr, region, m = job
    try:
        if m is None:
            arr[region] = lay.fill_value
            return
        if _direct(lay):
            _read_raw_into(fd, m, crcs[m.name], lay, arr[region].reshape(-1).view(np.uint8))
            return
        buf, direct = _dest(lay, arr, region)
        head = bytearray(m.data_offset - m.offset)
        data = np.empty(m.size, np.uint8)
        _preadv_exact(fd, [head, data], m.offset)
        _decode(head, data, m, crcs[m.name], lay, buf)
    except Exception as e:
        raise _JobError(name, key, e) from e
    _place(lay, arr, region, buf, direct, True)


def _decode(head: Any, data: np.ndarray, m: zc.Member, crc: int, lay: ArrayLayout,
            buf: np.ndarray) -> None:
    zc.check_local_header(head, m, crc)
    if not lay.checksum:
        _verify_zip_crc(data, crc)
    decode_chunk(data, lay, buf)


def _local_small(fd: int, crcs: dict[str, int], jobs: list[Any]) -> None:
    """Read a small batch's chunks with one ``preadv`` per run of adjacent members (usually
    one for the whole batch): headers and checksums aside, data straight into the arrays."""
    plans = []
    for job in jobs:
        name, key, lay, arr, region, m = job
        if m is None:
            arr[region] = lay.fill_value
            continue
        head = bytearray(m.data_offset - m.offset)
        if _direct(lay):
            want = lay.chunk_nbytes + (4 if lay.checksum else 0)
            if m.size != want:
                raise _JobError(name, key, ChunkError(f"chunk holds {m.size} bytes, expected "
                                                      f"{want}"))
            dest = arr[region].reshape(-1).view(np.uint8)
            plans.append((job, [head, dest, bytearray(m.size - dest.nbytes)], None, False))
        else:
            buf, direct = _dest(lay, arr, region)
            plans.append((job, [head, np.empty(m.size, np.uint8)], buf, direct))
    plans.sort(key=lambda p: p[0][5].offset)
    i = 0
    while i < len(plans):  # runs of adjacent members, at most _IOV_RUN buffers each
        j, iov = i, list(plans[i][1])
        while (j + 1 < len(plans) and plans[j + 1][0][5].offset == plans[j][0][5].end
               and len(iov) < _IOV_RUN):
            j += 1
            iov.extend(plans[j][1])
        try:
            _preadv_exact(fd, iov, plans[i][0][5].offset)
        except Exception as e:
            raise _JobError(plans[i][0][0], plans[i][0][1], e) from e
        for job, bufs, buf, direct in plans[i:j + 1]:
            name, key, lay, arr, region, m = job
            try:
                if buf is None:
                    _check_raw(bufs[0], bufs[1], bufs[2], m, crcs[m.name], lay)
                else:
                    _decode(bufs[0], bufs[1], m, crcs[m.name], lay, buf)
            except Exception as e:
                raise _JobError(name, key, e) from e
            if buf is not None:
                _place(lay, arr, region, buf, direct, True)
        i = j + 1


_IOV_RUN = 960


def _check_raw(head: Any, dest: np.ndarray, rest: bytearray, m: zc.Member, crc: int,
               lay: ArrayLayout) -> None:
    """Check a raw chunk read as header, data in place, and the rest (padding, crc32c)."""
    zc.check_local_header(head, m, crc)
    if lay.checksum:
        _check_crc32c(crc32c(dest), rest)
    elif zc.crc32_update(rest, zc.crc32_update(dest)) != crc:
        raise ChunkError("zip CRC-32 mismatch: the chunk is corrupt or was modified")


def _check_crc32c(computed: int, rest: Any) -> None:
    """``rest`` is the chunk's padding then its stored crc32c; ``computed`` covers the data."""
    stored = int.from_bytes(rest[-4:], "little")
    if len(rest) > 4:
        computed = crc32c(bytes(rest[:-4]), computed)
    if stored != computed:
        raise ChunkError(f"crc32c mismatch (stored {stored:#010x}, computed {computed:#010x}): "
                         "the chunk is corrupt or was modified")


def _preadv_exact(fd: int, bufs: list[Any], offset: int) -> None:
    want = sum(memoryview(b).nbytes for b in bufs)
    got = os.preadv(fd, bufs, offset)
    if got == want:
        return
    views = local_io.byte_views(bufs)
    local_io.advance(views, got)
    offset += got
    while views:
        n = os.preadv(fd, views, offset)
        if n == 0:
            raise ChunkError("the container ends inside this chunk (truncated file)")
        offset += n
        local_io.advance(views, n)


def _read_raw_into(fd: int, m: zc.Member, crc: int, lay: ArrayLayout, dest: np.ndarray) -> None:
    """An uncompressed little-endian chunk member straight into ``dest`` (its first
    ``dest.nbytes`` bytes; the rest, edge padding and crc32c, is read aside), checked block by
    block while each block is still in cache."""
    want = lay.chunk_nbytes + (4 if lay.checksum else 0)
    if m.size != want:
        raise ChunkError(f"chunk holds {m.size} bytes, expected {want}")
    head = bytearray(m.data_offset - m.offset)
    valid = dest.nbytes
    rest = bytearray(m.size - valid)
    computed = n = 0
    while n < valid or n == 0:
        block = dest[n:n + _CRC_BLOCK]
        if n == 0:
            _preadv_exact(fd, [head, block], m.offset)
            zc.check_local_header(head, m, crc)
        else:
            _preadv_exact(fd, [block], m.data_offset + n)
        computed = (crc32c if lay.checksum else zc.crc32_update)(block, computed)
        n += block.nbytes
        if not block.nbytes:
            break
    _preadv_exact(fd, [rest], m.data_offset + valid)
    if lay.checksum:
        _check_crc32c(computed, rest)
    elif zc.crc32_update(rest, computed) != crc:
        raise ChunkError("zip CRC-32 mismatch: the chunk is corrupt or was modified")


def _fetch(src: _Remote, members: Sequence[zc.Member], where: str) -> dict[str, bytes]:
    """Header and data of ``members`` by name, in one burst of range requests."""
    try:
        return dict(zip((m.name for m in members),
                        src.read_many([(m.offset, m.end) for m in members])))
    except zc.ZipFormatError as e:
        raise _refuse(where, f"its zip container is not accepted: {e}") from None


def _remote_jobs(src: _Remote, index: BatchIndex, jobs: list[Any], parallel: bool,
                 fetched: dict[str, bytes] | None = None) -> None:
    if fetched is None:
        wanted = [job[5] for job in jobs if job[5] is not None and index.cached(job[5]) is None]
        fetched = dict(zip((m.name for m in wanted),
                           src.read_many([(m.offset, m.end) for m in wanted])))

    def one(job: Any) -> None:
        name, key, lay, arr, region, m = job
        if m is None:
            arr[region] = lay.fill_value
            return
        try:
            raw = index.cached(m)
            if raw is None:
                raw = memoryview(fetched[m.name])
            head = m.data_offset - m.offset
            buf, direct = _dest(lay, arr, region)
            _decode(raw[:head], np.frombuffer(raw[head:], np.uint8), m, index.crcs[m.name],
                    lay, buf)
        except Exception as e:
            raise _JobError(name, key, e) from e
        _place(lay, arr, region, buf, direct, True)

    _map(one, jobs, parallel)
