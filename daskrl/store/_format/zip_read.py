"""Read the central directory of a stored ZIP archive (:mod:`.zip_container`'s subset):
:func:`find_directory` from the end records, :func:`parse_directory` into :class:`Member`
records, each checked against the rules, and :func:`check_local_header` for a member's local
header when its data is read."""

from __future__ import annotations

import dataclasses
import struct

from daskrl.store._format.zip_container import (
    CENTRAL_HEADER,
    DOS_DATE,
    END,
    END64,
    LOCAL_HEADER,
    LOCAL_HEADER_SIZE,
    LOCATOR64,
    MAX32,
    SIG_CENTRAL,
    SIG_END,
    SIG_END64,
    SIG_LOCAL,
    SIG_LOCATOR64,
    UTF8_FLAG,
    Member,
    ZipFormatError,
    check_name,
)

__all__ = ["Directory", "check_local_header", "find_directory", "mask_crcs", "parse_directory"]


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
    if sig != SIG_END:
        raise ZipFormatError("no end of central directory record in the last 22 bytes "
                             "(not a zip archive, an archive comment, or a truncated file)")
    if disk or cd_disk or n_disk != n or comment:
        raise ZipFormatError("a multi-disk archive or an archive comment")
    end_at = len(tail) - END.size  # position of the end record within tail
    end_bytes = END.size
    loc = end_at - LOCATOR64.size
    if loc >= 0 and struct.unpack_from("<I", tail, loc)[0] == SIG_LOCATOR64:
        _, loc_disk, end64_offset, disks = LOCATOR64.unpack_from(tail, loc)
        e64 = loc - END64.size
        if loc_disk or disks != 1 or e64 < 0:
            raise ZipFormatError("a ZIP64 end record this reader cannot locate")
        (sig64, rec_size, _, _, d, cdd, n_disk, n, cd_size, cd_offset) = END64.unpack_from(tail, e64)
        if sig64 != SIG_END64 or rec_size != END64.size - 12 or d or cdd or n_disk != n:
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
        if sig != SIG_CENTRAL:
            raise ZipFormatError(f"central directory entry {len(members)} has a bad signature")
        end = pos + nlen + xlen + clen
        if end > len(view):
            raise ZipFormatError("the central directory ends inside an entry")
        raw = bytes(view[pos:pos + nlen])
        extra = view[pos + nlen:pos + nlen + xlen]
        pos = end
        if flags & ~UTF8_FLAG:
            raise ZipFormatError(f"member {raw!r} has flags {flags:#06x} (encrypted, a data "
                                 "descriptor, or another feature this reader does not accept)")
        if method != 0:
            raise ZipFormatError(f"member {raw!r} is compressed (method {method}); members must be "
                                 "stored")
        if not (flags & UTF8_FLAG) and not raw.isascii():
            raise ZipFormatError(f"member name {raw!r} is neither ASCII nor flagged UTF-8")
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ZipFormatError(f"member name {raw!r} is not UTF-8") from e
        check_name(name)
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
        if usize == MAX32 and vals:
            usize = vals.pop(0)
        if csize == MAX32 and vals:
            csize = vals.pop(0)
        if offset == MAX32 and vals:
            offset = vals.pop(0)
        return csize, usize, offset, disk
    if pos != len(extra):
        raise ZipFormatError(f"member {name!r}: a malformed extra field")
    if MAX32 in (csize, usize, offset):
        raise ZipFormatError(f"member {name!r}: ZIP64 sizes or offset without a ZIP64 field")
    return csize, usize, offset, disk


def check_local_header(header: bytes | bytearray | memoryview, member: Member, crc: int) -> None:
    """Check that the local header read at ``member.offset`` (``30 + len(name)`` bytes) agrees
    with the central directory and carries no extra field."""
    raw = member.name_bytes
    if header == LOCAL_HEADER.pack(SIG_LOCAL, 20, member.flags, 0, 0, DOS_DATE, crc,
                                   member.size, member.size, len(raw), 0) + raw:
        return  # as daskrl writes it
    if len(header) != LOCAL_HEADER_SIZE + len(raw):
        raise ZipFormatError(f"member {member.name!r}: local header is truncated")
    (sig, _, flags, method, _, _, local_crc, csize, usize, nlen, xlen) = LOCAL_HEADER.unpack_from(header)
    if sig != SIG_LOCAL or nlen != len(raw) or bytes(header[LOCAL_HEADER_SIZE:]) != raw:
        raise ZipFormatError(f"member {member.name!r}: no matching local header at offset "
                             f"{member.offset}")
    if xlen or flags != member.flags or method or (local_crc, csize, usize) != (
            crc, member.size, member.size):
        raise ZipFormatError(f"member {member.name!r}: local header disagrees with the central "
                             "directory or has an extra field")
