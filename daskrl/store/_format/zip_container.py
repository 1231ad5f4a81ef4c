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

This module holds what both sides share: the records, :class:`Member`, the checksum and the
name rule.  :mod:`.zip_write` lays out archives from buffers without copying them (the archive
is a list of parts: header bytes and the callers' buffers); :mod:`.zip_read` finds, parses and
validates central directories and local headers.  I/O lives with the callers (:mod:`.encode`
and the writer, :mod:`.index` and :mod:`.read` for readers).
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
    "CENTRAL_HEADER",
    "DOS_DATE",
    "END",
    "END64",
    "END_SIZE",
    "LOCAL_HEADER",
    "LOCAL_HEADER_SIZE",
    "LOCATOR64",
    "MAX16",
    "MAX32",
    "SIG_CENTRAL",
    "SIG_END",
    "SIG_END64",
    "SIG_LOCAL",
    "SIG_LOCATOR64",
    "UTF8_FLAG",
    "Member",
    "ZipFormatError",
    "check_name",
    "crc32",
    "crc32_update",
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

SIG_LOCAL, SIG_CENTRAL = 0x04034B50, 0x02014B50
SIG_END, SIG_END64, SIG_LOCATOR64 = 0x06054B50, 0x06064B50, 0x07064B50
UTF8_FLAG = 0x0800
MAX32, MAX16 = 0xFFFFFFFF, 0xFFFF
DOS_DATE = (0 << 9) | (1 << 5) | 1  # 1980-01-01: member times carry no information
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


def check_name(name: str) -> bytes:
    if _BAD_NAME.search(name):
        raise ZipFormatError(f"member name {name!r} is not a relative POSIX path")
    return name.encode("utf-8")
