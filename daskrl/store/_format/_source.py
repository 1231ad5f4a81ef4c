"""Where a batch's bytes come from: the :class:`ByteSource` protocol and two sources.

The reader asks a source for its size, its last bytes and a list of byte ranges; a local
source also hands out its file descriptor, which lets the reader ``preadv`` straight into the
result arrays.  :class:`FileSource` is a container in a local store (opened safely: no link
followed, no FIFO waited on); :class:`BytesSource` holds the bytes in memory (small remote
objects, tests).  Remote stores provide their own source with the same methods.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from daskrl.errors import BatchDataMissingError
from daskrl.store._format import local_io
from daskrl.store._format.zip_container import ZipFormatError

__all__ = ["ByteSource", "BytesSource", "FileSource", "ShortReadError"]


class ShortReadError(ZipFormatError):
    """A range asked for lies (partly) past the end of the source: a truncated container, or
    end records that claim more than the file holds."""


@runtime_checkable
class ByteSource(Protocol):
    """Random access to the bytes of one container."""

    name: str
    """Names the container in messages (e.g. ``"batch 3 ('batches/...zip')"``)."""

    def size(self) -> int:
        """Bytes in the container."""
        ...

    def tail(self, n: int) -> bytes:
        """The last ``min(n, size)`` bytes."""
        ...

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """The bytes of each ``(offset, length)``; :class:`ShortReadError` if one lies past
        the end."""
        ...

    def fileno(self) -> int | None:
        """An open local file descriptor of the container, or None."""
        ...

    def close(self) -> None:
        """Release what the source holds (idempotent)."""
        ...


class FileSource:
    """A container in a local store, read with ``pread``.

    ``root``/``key`` is opened with :func:`~daskrl.store._format.local_io.open_regular`: a
    regular file inside the store or :class:`~daskrl.store._format.local_io.UnsafeFileError`
    (:class:`~daskrl.BatchDataMissingError` when it does not exist).  ``checked``: directories
    of the store already found to be real ones.
    """

    def __init__(self, root: str | Path, key: str, name: str = "",
                 checked: set[str] | None = None) -> None:
        self.name = name or repr(key)
        try:
            self._fd: int | None = local_io.open_regular(root, key, checked)
        except (FileNotFoundError, NotADirectoryError):
            raise BatchDataMissingError(f"{self.name}: the container {key!r} is missing.") from None
        except local_io.UnsafeFileError as e:
            raise local_io.UnsafeFileError(f"{self.name}: {e}; the batch was not read") from None
        self._size = os.fstat(self._fd).st_size

    def size(self) -> int:
        return self._size

    def tail(self, n: int) -> bytes:
        n = min(n, self._size)
        return self.read_ranges([(self._size - n, n)])[0]

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        fd = self._open_fd()
        out = []
        for offset, length in ranges:
            data = os.pread(fd, length, offset)
            if len(data) != length:
                raise ShortReadError(f"bytes {offset}..{offset + length} lie past the end of "
                                     "the file")
            out.append(data)
        return out

    def fileno(self) -> int | None:
        return self._fd

    def _open_fd(self) -> int:
        if self._fd is None:
            raise local_io.UnsafeFileError(f"{self.name}: the source is closed")
        return self._fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FileSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BytesSource:
    """A container held in memory."""

    def __init__(self, data: bytes, name: str = "a container in memory") -> None:
        self.name = name
        self._data = bytes(data)

    def size(self) -> int:
        return len(self._data)

    def tail(self, n: int) -> bytes:
        return self._data[max(0, len(self._data) - n):]

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        out = []
        for offset, length in ranges:
            if offset < 0 or length < 0 or offset + length > len(self._data):
                raise ShortReadError(f"bytes {offset}..{offset + length} lie past the end of "
                                     f"the {len(self._data)} bytes held")
            out.append(self._data[offset:offset + length])
        return out

    def fileno(self) -> int | None:
        return None

    def close(self) -> None:
        pass
