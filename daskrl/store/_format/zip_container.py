"""The batch container of store format 2.x: an uncompressed (stored) ZIP archive.

A batch is one file instead of a directory tree: on a local filesystem a directory costs a
``mkdir`` and every file a create; on shared filesystems
each is a metadata-server operation and on object stores a request.  ZIP is the container that
zarr (``zarr.storage.ZipStore``), Python (``zipfile``) and every platform read without daskrl.

Only what daskrl needs is written and accepted:

* every member is *stored* (method 0, no compression, no encryption, no data descriptor);
  its local header carries no extra field, so its data starts ``30 + len(name)`` bytes after
  the header;
* member names are relative POSIX paths (UTF-8, flag bit 11 when not ASCII);
* members are at most 4 GiB - 1 each; the archive may exceed 4 GiB and hold more than 65535
  members (ZIP64 end records and ZIP64 offsets in the central directory, as ``zipfile`` does);
* no archive comment: the end record is the file's last 22 bytes.

This module builds archives from buffers without copying them (the archive is a list of parts:
header bytes and the callers' buffers) and parses and validates central directories; I/O lives
with the callers (:mod:`.encode` and the writer, :mod:`.index` and :mod:`.read` for readers).
"""

from __future__ import annotations

import dataclasses
import re
import struct
from collections.abc import Sequence
from typing import Any

# zlib-ng's CRC-32 runs several times faster than the stdlib's zlib 1.2; ZIP needs one per
# member, over every byte of the batch.
from zlib_ng.zlib_ng import crc32 as _crc32

from daskrl.errors import StoreFormatError

__all__ = [
    "END_SIZE",
    "LOCAL_HEADER_SIZE",
    "Archive",
    "Member",
    "Plan",
    "ZipFormatError",
    "build_archive",
    "check_local_header",
    "crc32",
    "find_directory",
    "mask_crcs",
    "parse_directory",
    "plan_archive",
]

LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")
CENTRAL_HEADER = struct.Struct("<IHHHHHHIIIHHHHHII")
END = struct.Struct("<IHHHHIIH")
END64 = struct.Struct("<IQHHIIQQQQ")
LOCATOR64 = struct.Struct("<IIQI")
LOCAL_HEADER_SIZE = LOCAL_HEADER.size
"""Bytes of a local header before its name (30)."""
END_SIZE = END.size
"""Bytes of the end of central directory record (22)."""

_SIG_LOCAL, _SIG_CENTRAL = 0x04034B50, 0x02014B50
_SIG_END, _SIG_END64, _SIG_LOCATOR64 = 0x06054B50, 0x06064B50, 0x07064B50
_UTF8 = 0x0800
_MAX32, _MAX16 = 0xFFFFFFFF, 0xFFFF
_DOS_DATE = (0 << 9) | (1 << 5) | 1  # 1980-01-01: member times carry no information
_MADE_BY = (3 << 8) | 45  # Unix, ZIP 4.5
_FILE_MODE = (0o100644 << 16)
_BAD_NAME = re.compile(r"[\x00-\x1f\\]|(?:^|/)\.{0,2}(?:/|$)")


class ZipFormatError(StoreFormatError, ValueError):
    """An archive outside what this module writes and accepts."""


@dataclasses.dataclass(frozen=True, slots=True)
class Member:
    """Where one member of an archive lies, as its central directory states it (its CRC-32 is
    kept apart: batches of one shape share the rest)."""

    name: str
    offset: int
    """Offset of the member's local header."""
    size: int
    """Bytes of data (stored: compressed and uncompressed sizes are equal)."""
    flags: int
    name_bytes: bytes
    data_offset: int
    """Where the data starts (the local header carries no extra field)."""
    end: int
    """Where the data ends."""

    @classmethod
    def make(cls, name: str, raw: bytes, offset: int, size: int, flags: int) -> Member:
        data = offset + LOCAL_HEADER_SIZE + len(raw)
        return cls(name, offset, size, flags, raw, data, data + size)


@dataclasses.dataclass(frozen=True)
class Archive:
    """An archive ready to write: ``parts`` joined, in order, are the file."""

    parts: list[Any]
    members: list[Member]
    crcs: list[int]
    size: int


def crc32(parts: Sequence[Any]) -> int:
    """ZIP's CRC-32 of the buffers ``parts`` joined (zlib releases the GIL; zlib-ng is used
    when installed)."""
    crc = 0
    for p in parts:
        crc = _crc32(p, crc)
    return crc


def crc32_update(data: Any, crc: int = 0) -> int:
    """ZIP's CRC-32 of ``crc``'s bytes followed by the buffer ``data``."""
    return _crc32(data, crc)


def _nbytes(part: Any) -> int:
    return memoryview(part).nbytes


def _check_name(name: str) -> bytes:
    if _BAD_NAME.search(name):
        raise ZipFormatError(f"member name {name!r} is not a relative POSIX path")
    return name.encode("utf-8")


@dataclasses.dataclass(frozen=True)
class Plan:
    """Where each member of an archive goes, before its CRC-32 is known (offsets and sizes do
    not depend on it): data can be written while CRCs are computed, headers after."""

    members: list[Member]
    force_zip64: bool = False

    @property
    def directory_offset(self) -> int:
        return self.members[-1].end if self.members else 0

    def local_header(self, m: Member, crc: int) -> bytes:
        """Bytes of ``m``'s local header (name included), to write at ``m.offset``."""
        return LOCAL_HEADER.pack(_SIG_LOCAL, 20, m.flags, 0, 0, _DOS_DATE, crc, m.size, m.size,
                                 len(m.name_bytes), 0) + m.name_bytes

    def trailer(self, crcs: Sequence[int]) -> bytes:
        """Central directory and end records, to write at :attr:`directory_offset`."""
        directory = bytearray()
        for m, crc in zip(self.members, crcs, strict=True):
            raw = m.name_bytes
            extra = b""
            offset = m.offset
            if self.force_zip64 or offset >= _MAX32:
                extra = struct.pack("<HHQ", 1, 8, offset)
                offset = _MAX32
            directory += CENTRAL_HEADER.pack(
                _SIG_CENTRAL, _MADE_BY, 45 if extra else 20, m.flags, 0, 0, _DOS_DATE, crc,
                m.size, m.size, len(raw), len(extra), 0, 0, 0, _FILE_MODE, offset) + raw + extra
        cd_offset, cd_size, n = self.directory_offset, len(directory), len(self.members)
        if self.force_zip64 or n >= _MAX16 or cd_offset >= _MAX32 or cd_size >= _MAX32:
            directory += END64.pack(_SIG_END64, END64.size - 12, _MADE_BY, 45, 0, 0, n, n,
                                    cd_size, cd_offset)
            directory += LOCATOR64.pack(_SIG_LOCATOR64, 0, cd_offset + cd_size, 1)
            directory += END.pack(_SIG_END, 0, 0, min(n, _MAX16), min(n, _MAX16),
                                  min(cd_size, _MAX32), min(cd_offset, _MAX32), 0)
        else:
            directory += END.pack(_SIG_END, 0, 0, n, n, cd_size, cd_offset, 0)
        return bytes(directory)


def plan_archive(entries: Sequence[tuple[str, Sequence[Any]]], *,
                 force_zip64: bool = False) -> Plan:
    """Lay out ``(name, buffers)`` entries, in order, as members of a stored ZIP archive.

    ``force_zip64`` writes ZIP64 records even when not needed (for tests).
    """
    members: list[Member] = []
    seen: set[str] = set()
    pos = 0
    for name, parts in entries:
        raw = _check_name(name)
        if name in seen:
            raise ZipFormatError(f"member name {name!r} occurs twice")
        seen.add(name)
        size = sum(_nbytes(p) for p in parts)
        if size >= _MAX32:
            raise ZipFormatError(f"member {name!r} holds {size} bytes; a member holds at most "
                                 f"{_MAX32 - 1} bytes (4 GiB - 1)")
        m = Member.make(name, raw, pos, size, 0 if raw.isascii() else _UTF8)
        members.append(m)
        pos = m.end
    return Plan(members, force_zip64)


def build_archive(
    entries: Sequence[tuple[str, Sequence[Any]]],
    crcs: Sequence[int] | None = None,
    *,
    force_zip64: bool = False,
) -> Archive:
    """Lay out ``(name, buffers)`` entries as a stored ZIP archive, ready to write.

    ``crcs`` are the entries' CRC-32 (:func:`crc32`), computed here when None.  The buffers are
    not copied: they become parts of the archive between the header bytes.
    """
    if crcs is None:
        crcs = [crc32(parts) for _, parts in entries]
    plan = plan_archive(entries, force_zip64=force_zip64)
    out: list[Any] = []
    for m, (_, parts), crc in zip(plan.members, entries, crcs, strict=True):
        out.append(plan.local_header(m, crc))
        out.extend(parts)
    trailer = plan.trailer(crcs)
    out.append(trailer)
    return Archive(out, plan.members, list(crcs), plan.directory_offset + len(trailer))


# -- reading ------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class Directory:
    """Where an archive's central directory lies, from its end records."""

    offset: int
    size: int
    count: int
    archive_size: int


def find_directory(tail: bytes, tail_offset: int | None, archive_size: int | None,
                   max_directory_bytes: int = 64 << 20) -> Directory:
    """Locate the central directory from the archive's last bytes ``tail``.

    ``tail_offset`` is where ``tail`` starts in the archive and ``archive_size`` the archive's
    size, when known (a local file); otherwise the size follows from the end records (the
    directory must end where they begin) and ``tail_offset`` from it.  Raises
    :class:`ZipFormatError` when the end records are missing or inconsistent, or describe a
    directory larger than ``max_directory_bytes``.
    """
    if len(tail) < END.size:
        raise ZipFormatError(f"{len(tail)} bytes are too few for a zip archive")
    sig, disk, cd_disk, n_disk, n, cd_size, cd_offset, comment = END.unpack_from(tail, len(tail) - END.size)
    if sig != _SIG_END:
        raise ZipFormatError("no end of central directory record in the last 22 bytes "
                             "(not a zip archive, an archive comment, or a truncated file)")
    if disk or cd_disk or n_disk != n or comment:
        raise ZipFormatError("a multi-disk archive or an archive comment")
    end_at = len(tail) - END.size  # position of the end record within tail
    end_bytes = END.size
    loc = end_at - LOCATOR64.size
    if loc >= 0 and struct.unpack_from("<I", tail, loc)[0] == _SIG_LOCATOR64:
        _, loc_disk, end64_offset, disks = LOCATOR64.unpack_from(tail, loc)
        e64 = loc - END64.size
        if loc_disk or disks != 1 or e64 < 0:
            raise ZipFormatError("a ZIP64 end record this reader cannot locate")
        (sig64, rec_size, _, _, d, cdd, n_disk, n, cd_size, cd_offset) = END64.unpack_from(tail, e64)
        if sig64 != _SIG_END64 or rec_size != END64.size - 12 or d or cdd or n_disk != n:
            raise ZipFormatError("a malformed or multi-disk ZIP64 end record")
        end_bytes += LOCATOR64.size + END64.size
        size = cd_offset + cd_size + end_bytes
        if end64_offset != cd_offset + cd_size:
            raise ZipFormatError("the ZIP64 end record is not where its locator says")
    else:
        size = cd_offset + cd_size + end_bytes
    if archive_size is not None and size != archive_size:
        raise ZipFormatError(f"the end records describe an archive of {size} bytes, the file "
                             f"holds {archive_size} (data after the directory, or a directory "
                             "that is not where the end record says)")
    if tail_offset is not None and tail_offset + len(tail) != size:
        raise ZipFormatError(f"the end records describe an archive of {size} bytes, which does "
                             f"not end where the file does ({tail_offset + len(tail)})")
    if cd_size < n * CENTRAL_HEADER.size:
        raise ZipFormatError(f"a central directory of {cd_size} bytes for {n} members")
    if cd_size > max_directory_bytes:
        raise ZipFormatError(f"a central directory of {cd_size} bytes, more than the "
                             f"{max_directory_bytes} accepted (ReadLimits.max_directory_bytes)")
    return Directory(cd_offset, cd_size, n, size)


def parse_directory(data: bytes | memoryview, directory: Directory) -> tuple[list[Member], dict[str, int]]:
    """Members of the central directory ``data`` (exactly ``directory.size`` bytes), sorted by
    offset, and their CRC-32 by name; checked: stored members only, no encryption or data
    descriptors, safe unique names, and member extents that lie before the directory without
    overlapping."""
    if len(data) != directory.size:
        raise ZipFormatError(f"central directory holds {len(data)} bytes, expected {directory.size}")
    return _parse_directory(memoryview(data), directory)


_ENTRY_TAIL = struct.Struct("<16xI8xHHH")


def mask_crcs(data: bytes | memoryview, count: int) -> tuple[bytearray, list[int]] | None:
    """The directory with its CRC-32 fields zeroed, and those CRCs in entry order (None when the
    entries do not tile the directory: the full parse reports why).  Batches of one shape have
    directories equal but for their CRCs: the masked bytes are a cache key for the parse."""
    out = bytearray(data)
    crcs = []
    pos = 0
    try:
        for _ in range(count):
            crc, nlen, xlen, clen = _ENTRY_TAIL.unpack_from(out, pos)
            out[pos + 16:pos + 20] = b"\0\0\0\0"
            crcs.append(crc)
            pos += CENTRAL_HEADER.size + nlen + xlen + clen
    except struct.error:
        return None
    return (out, crcs) if pos == len(out) else None


def _parse_directory(view: memoryview, directory: Directory) -> tuple[list[Member], dict[str, int]]:
    members: list[Member] = []
    crcs: dict[str, int] = {}
    pos = 0
    for _ in range(directory.count):
        if pos + CENTRAL_HEADER.size > len(view):
            raise ZipFormatError("the central directory ends inside an entry")
        (sig, _, _, flags, method, _, _, crc, csize, usize, nlen, xlen, clen, disk, _, _,
         offset) = CENTRAL_HEADER.unpack_from(view, pos)
        pos += CENTRAL_HEADER.size
        if sig != _SIG_CENTRAL:
            raise ZipFormatError(f"central directory entry {len(members)} has a bad signature")
        end = pos + nlen + xlen + clen
        if end > len(view):
            raise ZipFormatError("the central directory ends inside an entry")
        raw = bytes(view[pos:pos + nlen])
        extra = view[pos + nlen:pos + nlen + xlen]
        pos = end
        if flags & ~_UTF8:
            raise ZipFormatError(f"member {raw!r} has flags {flags:#06x} (encrypted, a data "
                                 "descriptor, or another feature this reader does not accept)")
        if method != 0:
            raise ZipFormatError(f"member {raw!r} is compressed (method {method}); members must be "
                                 "stored")
        if not (flags & _UTF8) and not raw.isascii():
            raise ZipFormatError(f"member name {raw!r} is neither ASCII nor flagged UTF-8")
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ZipFormatError(f"member name {raw!r} is not UTF-8") from e
        _check_name(name)
        if name in crcs:
            raise ZipFormatError(f"member name {name!r} occurs twice")
        csize, usize, offset, disk = _zip64_fields(extra, csize, usize, offset, disk, name)
        if csize != usize or disk:
            raise ZipFormatError(f"member {name!r}: sizes {csize} != {usize} or on another disk")
        members.append(Member.make(name, raw, offset, usize, flags))
        crcs[name] = crc
    if pos != len(view):
        raise ZipFormatError("the central directory holds more than its entries")
    members.sort(key=lambda m: m.offset)
    prev_end = 0
    for m in members:
        if m.offset < prev_end:
            raise ZipFormatError(f"member {m.name!r} at offset {m.offset} overlaps the member "
                                 "before it")
        prev_end = m.end
    if prev_end > directory.offset:
        raise ZipFormatError(f"member data extends to {prev_end}, past the start of the central "
                             f"directory at {directory.offset}")
    return members, crcs


def _zip64_fields(extra: memoryview, csize: int, usize: int, offset: int, disk: int,
                  name: str) -> tuple[int, int, int, int]:
    pos = 0
    while pos + 4 <= len(extra):
        tag, n = struct.unpack_from("<HH", extra, pos)
        body = extra[pos + 4:pos + 4 + n]
        pos += 4 + n
        if len(body) != n:
            break
        if tag != 1:
            continue  # other extra fields (timestamps, owners) carry nothing a reader needs
        vals = list(struct.unpack_from(f"<{n // 8}Q", body)) if n % 8 == 0 else None
        if vals is None:
            raise ZipFormatError(f"member {name!r}: a malformed ZIP64 extra field")
        if usize == _MAX32 and vals:
            usize = vals.pop(0)
        if csize == _MAX32 and vals:
            csize = vals.pop(0)
        if offset == _MAX32 and vals:
            offset = vals.pop(0)
        return csize, usize, offset, disk
    if pos != len(extra):
        raise ZipFormatError(f"member {name!r}: a malformed extra field")
    if _MAX32 in (csize, usize, offset):
        raise ZipFormatError(f"member {name!r}: ZIP64 sizes or offset without a ZIP64 field")
    return csize, usize, offset, disk


def check_local_header(header: bytes | bytearray | memoryview, member: Member, crc: int) -> None:
    """Check that the local header read at ``member.offset`` (``30 + len(name)`` bytes) agrees
    with the central directory and carries no extra field."""
    raw = member.name_bytes
    if header == LOCAL_HEADER.pack(_SIG_LOCAL, 20, member.flags, 0, 0, _DOS_DATE, crc,
                                   member.size, member.size, len(raw), 0) + raw:
        return  # as daskrl writes it
    if len(header) != LOCAL_HEADER_SIZE + len(raw):
        raise ZipFormatError(f"member {member.name!r}: local header is truncated")
    (sig, _, flags, method, _, _, local_crc, csize, usize, nlen, xlen) = LOCAL_HEADER.unpack_from(header)
    if sig != _SIG_LOCAL or nlen != len(raw) or bytes(header[LOCAL_HEADER_SIZE:]) != raw:
        raise ZipFormatError(f"member {member.name!r}: no matching local header at offset "
                             f"{member.offset}")
    if xlen or flags != member.flags or method or (local_crc, csize, usize) != (
            crc, member.size, member.size):
        raise ZipFormatError(f"member {member.name!r}: local header disagrees with the central "
                             "directory or has an extra field")
