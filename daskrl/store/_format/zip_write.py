"""Lay out a stored ZIP archive (:mod:`.zip_container`'s subset) from buffers, without copying
them: :func:`plan_archive` places the members before their CRC-32s are known, so data can be
written while they are computed; :func:`build_archive` gives the whole file as parts."""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence
from typing import Any

from daskrl.store._format.zip_container import (
    CENTRAL_HEADER,
    DOS_DATE,
    END,
    END64,
    LOCAL_HEADER,
    LOCATOR64,
    MAX16,
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
    crc32,
)

__all__ = ["Archive", "Plan", "build_archive", "plan_archive"]

_MADE_BY = (3 << 8) | 45  # Unix, ZIP 4.5
_FILE_MODE = (0o100644 << 16)


@dataclasses.dataclass(frozen=True)
class Archive:
    """An archive ready to write: ``parts`` joined, in order, are the file."""

    parts: list[Any]
    members: list[Member]
    crcs: list[int]
    size: int


def _nbytes(part: Any) -> int:
    return memoryview(part).nbytes


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
        return LOCAL_HEADER.pack(SIG_LOCAL, 20, m.flags, 0, 0, DOS_DATE, crc, m.size, m.size,
                                 len(m.name_bytes), 0) + m.name_bytes

    def trailer(self, crcs: Sequence[int]) -> bytes:
        """Central directory and end records, to write at :attr:`directory_offset`."""
        directory = bytearray()
        for m, crc in zip(self.members, crcs, strict=True):
            raw = m.name_bytes
            extra = b""
            offset = m.offset
            if self.force_zip64 or offset >= MAX32:
                extra = struct.pack("<HHQ", 1, 8, offset)
                offset = MAX32
            directory += CENTRAL_HEADER.pack(
                SIG_CENTRAL, _MADE_BY, 45 if extra else 20, m.flags, 0, 0, DOS_DATE, crc,
                m.size, m.size, len(raw), len(extra), 0, 0, 0, _FILE_MODE, offset) + raw + extra
        cd_offset, cd_size, n = self.directory_offset, len(directory), len(self.members)
        if self.force_zip64 or n >= MAX16 or cd_offset >= MAX32 or cd_size >= MAX32:
            directory += END64.pack(SIG_END64, END64.size - 12, _MADE_BY, 45, 0, 0, n, n,
                                    cd_size, cd_offset)
            directory += LOCATOR64.pack(SIG_LOCATOR64, 0, cd_offset + cd_size, 1)
            directory += END.pack(SIG_END, 0, 0, min(n, MAX16), min(n, MAX16),
                                  min(cd_size, MAX32), min(cd_offset, MAX32), 0)
        else:
            directory += END.pack(SIG_END, 0, 0, n, n, cd_size, cd_offset, 0)
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
        raw = check_name(name)
        if name in seen:
            raise ZipFormatError(f"member name {name!r} occurs twice")
        seen.add(name)
        size = sum(_nbytes(p) for p in parts)
        if size >= MAX32:
            raise ZipFormatError(f"member {name!r} holds {size} bytes; a member holds at most "
                                 f"{MAX32 - 1} bytes (4 GiB - 1)")
        m = Member.make(name, raw, pos, size, 0 if raw.isascii() else UTF8_FLAG)
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
