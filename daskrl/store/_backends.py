"""Where a store's bytes live: one small class per storage backend behind one protocol.

:class:`Backend` names what a backend can do, so callers never ask which one they hold:
:class:`LocalBackend` (a POSIX directory, plain file I/O with ``O_NOFOLLOW`` and no special
files, see :mod:`daskrl.store._format.local_io`) and :class:`FsspecBackend` (any fsspec
filesystem, through fsspec's public synchronous API).  ``backend.byte_source(key)`` opens the
:class:`ByteSource` the format code reads a container through.  The only module of daskrl that
uses fsspec directly; zarr's storage classes are not used at all.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import time
import uuid
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import fsspec

from daskrl.errors import BatchDataMissingError, StoreError
from daskrl.store._format import ByteSource, EncodedBatch, FileSource, ShortReadError, local_io
from daskrl.store._url import is_local, local_path

__all__ = ["Backend", "ByteSource", "FileInfo", "FsspecBackend", "LocalBackend", "open_backend"]

FileInfo = tuple[str, int, float]
"""``(key, size in bytes, modification time in Unix seconds)``."""

_PARALLEL_WRITE_BYTES = 4 << 20
"""Local containers at least this large are written by the thread pool while their CRC-32s are
computed (zlib releases the GIL)."""

_EXCLUSIVE_PROTOCOLS = frozenset({"s3", "s3a", "memory"})
"""fsspec protocols whose ``pipe_file(mode="create")`` is known to be an exclusive create
(s3fs sends ``If-None-Match: *``); others may ignore the mode and overwrite."""


class Backend(Protocol):
    """What the store layer needs of a storage backend (keys ``/``-separated, relative to the
    store's root). Capabilities: ``supports_exclusive_create`` (of two concurrent creates
    exactly one wins), ``local_root`` (a POSIX directory whose files may be opened directly, or
    None), ``renames_atomically``, ``leaves_partial_files`` (interrupted writes can leave
    ``*.partial`` files), ``lists_empty_dirs`` (a listing can show a directory whose files are
    gone)."""

    url: str
    supports_exclusive_create: bool
    local_root: str | None
    renames_atomically: bool
    leaves_partial_files: bool
    lists_empty_dirs: bool

    def read_document(self, key: str, limit: int, checked: set[str] | None = None
                      ) -> bytes | None: ...
    def read_document_identified(self, key: str, limit: int, checked: set[str] | None = None
                                 ) -> tuple[bytes | None, Hashable | None]: ...
    def identity(self, key: str) -> Hashable | None: ...
    def put(self, key: str, data: bytes) -> None: ...
    def create_exclusive(self, key: str, data: bytes) -> bool: ...
    def write_container(self, key: str, batch: EncodedBatch) -> None: ...
    def write_new(self, key: str, parts: Sequence[Any]) -> None: ...
    def exists(self, key: str) -> bool: ...
    def entry_exists(self, key: str) -> bool: ...
    def delete(self, key: str) -> None: ...
    def delete_prefix(self, prefix: str) -> None: ...
    def rename(self, src: str, dst: str) -> None: ...
    def list_dir(self, prefix: str) -> list[str]: ...
    def files(self, prefix: str) -> list[FileInfo]: ...
    def root_files(self) -> list[FileInfo]: ...
    def remove_empty_dirs(self, prefix: str, older_than: float) -> None: ...
    def invalidate(self, prefix: str) -> None: ...
    def byte_source(self, key: str, name: str = "", checked: set[str] | None = None
                    ) -> ByteSource: ...


def open_backend(url: str, storage_options: Mapping[str, Any], read_only: bool) -> Backend:
    """The backend of the (normalized) store ``url``."""
    if is_local(url):
        return LocalBackend(url, read_only)
    return FsspecBackend(url, storage_options, read_only)


# -- local POSIX ------------------------------------------------------------------------------
class LocalBackend:
    """A store in a local (or shared POSIX) directory."""

    supports_exclusive_create = True  # temp file + link
    renames_atomically = True
    leaves_partial_files = True
    lists_empty_dirs = True

    def __init__(self, url: str, read_only: bool) -> None:
        self.url = url
        self.local_root: str | None = local_path(url)
        self.root = local_path(url)
        self._read_only = read_only

    def _path(self, key: str) -> str:
        return os.path.join(self.root, key)

    def read_document(self, key: str, limit: int, checked: set[str] | None = None
                      ) -> bytes | None:
        return local_io.read_file(self.root, key, limit, checked)

    def read_document_identified(self, key: str, limit: int, checked: set[str] | None = None
                                 ) -> tuple[bytes | None, Hashable | None]:
        """The document and the identity of the file it was read from (see :meth:`identity`)."""
        got = local_io.read_file_identified(self.root, key, limit, checked)
        return (None, None) if got is None else got

    def identity(self, key: str) -> Hashable | None:
        """Device, inode, size and times of the file ``key`` (one ``lstat``): unchanged, the
        file holds what was read when it had this identity; None if it is missing."""
        return local_io.file_identity(self.root, key)

    def put(self, key: str, data: bytes) -> None:
        """Write ``key`` atomically (a temporary file renamed over it)."""
        path = self._path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.partial"
        with open(tmp, "xb") as f:
            f.write(data)
        os.replace(tmp, path)

    def create_exclusive(self, key: str, data: bytes) -> bool:
        return local_io.create_exclusive(Path(self.root), key, data)

    def write_new(self, key: str, parts: Sequence[Any]) -> None:
        """A new file (``FileExistsError`` if there is one) holding ``parts`` joined, written
        in place without joining them (one ``pwritev``)."""
        local_io.write_new_file(self._path(key), parts)

    def write_container(self, key: str, batch: EncodedBatch) -> None:
        """A container into a new file, in place (invisible until committed): small ones with
        one ``pwritev``; large ones with their members' data written by the thread pool while
        their CRC-32s are computed, then the headers and the directory (which need the CRCs)."""
        file = self._path(key)
        if batch.nbytes < _PARALLEL_WRITE_BYTES:
            local_io.write_new_file(file, batch.parts())
            return
        pool = local_io.thread_pool()
        crcs = [pool.submit(batch.member_crc, i) for i in range(len(batch.entries))]
        local_io.write_new_file_at(file, batch.data_pieces(), pool,
                                   lambda: batch.header_pieces([f.result() for f in crcs]))

    def exists(self, key: str) -> bool:
        return os.path.isfile(self._path(key))

    def entry_exists(self, key: str) -> bool:
        return os.path.lexists(self._path(key))  # a link or special file counts (then refused)

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(key))

    def delete_prefix(self, prefix: str) -> None:
        shutil.rmtree(self._path(prefix), ignore_errors=True)

    def rename(self, src: str, dst: str) -> None:
        os.rename(self._path(src), self._path(dst))

    def list_dir(self, prefix: str) -> list[str]:
        return sorted(local_io.listdir(Path(self.root), prefix))

    def files(self, prefix: str) -> list[FileInfo]:
        """Every file under ``prefix``."""
        root = Path(self.root)
        out: list[FileInfo] = []
        for dirpath, _, names in os.walk(root / prefix):
            for name in names:
                p = Path(dirpath) / name
                try:
                    st = p.stat()
                except FileNotFoundError:  # removed meanwhile (a temp file renamed)
                    continue
                out.append((p.relative_to(root).as_posix(), st.st_size, st.st_mtime))
        return out

    def root_files(self) -> list[FileInfo]:
        out: list[FileInfo] = []
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.root):
                if entry.is_file(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    out.append((entry.name, st.st_size, st.st_mtime))
        return out

    def remove_empty_dirs(self, prefix: str, older_than: float) -> None:
        """Remove empty directories under ``prefix`` (bottom-up) older than ``older_than``
        seconds (a writer may be about to write into a new one)."""
        top = Path(self.root) / prefix
        now = time.time()
        for dirpath, _, _ in sorted(os.walk(top), key=lambda w: -len(w[0])):
            if Path(dirpath) != top:
                try:
                    if now - os.stat(dirpath).st_mtime >= older_than:
                        os.rmdir(dirpath)
                except OSError:  # not empty, or gone
                    pass

    def invalidate(self, prefix: str) -> None:
        """Nothing is cached."""

    def byte_source(self, key: str, name: str = "", checked: set[str] | None = None
                    ) -> FileSource:
        return FileSource(self.root, key, name or repr(key), checked)


# -- fsspec ----------------------------------------------------------------------------------
def _mtime(info: Mapping[str, Any]) -> float:
    """Modification time (Unix seconds) of an fsspec ``info`` entry; 0 when unknown."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if isinstance(value, datetime.datetime):
            if value.tzinfo is None:
                value = value.replace(tzinfo=datetime.timezone.utc)
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return 0.0


class FsspecByteSource:
    """An object of an fsspec filesystem, read with (suffix and) range requests."""

    def __init__(self, fs: Any, path: str, name: str) -> None:
        self.name = name
        self._fs, self._path = fs, path
        self._size: int | None = None

    def _missing(self) -> BatchDataMissingError:
        return BatchDataMissingError(f"{self.name}: the container {self._path!r} is missing.")

    def size(self) -> int:
        if self._size is None:
            try:
                self._size = int(self._fs.size(self._path))
            except FileNotFoundError:
                raise self._missing() from None
        return self._size

    def tail(self, n: int) -> bytes:
        try:
            data = bytes(self._fs.cat_file(self._path, start=-n)) if n > 0 else b""
        except FileNotFoundError:
            raise self._missing() from None
        if len(data) < n:  # the whole object: its size is known
            self._size = len(data)
        return data

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        if not ranges:
            return []
        try:
            got = self._fs.cat_ranges([self._path] * len(ranges), [a for a, _ in ranges],
                                      [a + n for a, n in ranges], on_error="raise")
        except FileNotFoundError:
            raise self._missing() from None
        out = [bytes(b) for b in got]
        for (a, n), data in zip(ranges, out):
            if len(data) != n:
                raise ShortReadError(f"bytes {a}..{a + n} lie past the end of the object")
        return out

    def fileno(self) -> int | None:
        return None

    def close(self) -> None:
        """Nothing is held open."""


class FsspecBackend:
    """A store on any fsspec filesystem (``memory://``, ``s3://``, chained URLs, ...)."""

    local_root: str | None = None
    renames_atomically = False
    leaves_partial_files = False
    lists_empty_dirs = False

    def __init__(self, url: str, storage_options: Mapping[str, Any], read_only: bool) -> None:
        self.url = url
        self._options = dict(storage_options)
        self._read_only = read_only
        try:
            self.fs, self.base = fsspec.core.url_to_fs(url, **self._options)
        except ImportError as e:
            raise StoreError(
                f"cannot open store {url!r}: {e}. Install the fsspec backend for this protocol "
                "(e.g. pip install s3fs for s3://)."
            ) from e
        self.base = self.base.rstrip("/")
        protocols = self.fs.protocol
        protocols = protocols if isinstance(protocols, (tuple, list)) else (protocols,)
        self.supports_exclusive_create = bool(_EXCLUSIVE_PROTOCOLS.intersection(protocols))

    def _path(self, key: str) -> str:
        return f"{self.base}/{key}" if key else self.base

    def _key(self, path: str) -> str:
        path = path.rstrip("/")
        return path[len(self.base) + 1:] if self.base else path

    def read_document_identified(self, key: str, limit: int, checked: set[str] | None = None
                                 ) -> tuple[bytes | None, Hashable | None]:
        return self.read_document(key, limit, checked), None  # no identity: always re-read

    def identity(self, key: str) -> Hashable | None:
        return None

    def read_document(self, key: str, limit: int, checked: set[str] | None = None
                      ) -> bytes | None:
        try:  # a bounded read: a huge or endless object must not exhaust memory
            return bytes(self.fs.cat_file(self._path(key), start=0, end=limit + 1))
        except FileNotFoundError:
            return None

    def put(self, key: str, data: bytes) -> None:
        self.fs.pipe_file(self._path(key), data)

    def write_new(self, key: str, parts: Sequence[Any]) -> None:
        self.fs.pipe_file(self._path(key), b"".join(parts))

    def create_exclusive(self, key: str, data: bytes) -> bool:
        if self.supports_exclusive_create:  # a real exclusive create (S3: If-None-Match: *)
            try:
                self.fs.pipe_file(self._path(key), data, mode="create")
                return True
            except FileExistsError:
                return False
        # Elsewhere check, then write, then read back: two writers can both pass the check.
        if not self.exists(key):
            self.put(key, data)
        return self.read_document(key, len(data)) == data

    def write_container(self, key: str, batch: EncodedBatch) -> None:
        self.put(key, b"".join(bytes(p) for p in batch.parts()))

    def exists(self, key: str) -> bool:
        path = self._path(key)
        self.fs.invalidate_cache(path)
        return bool(self.fs.exists(path))

    entry_exists = exists

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._path(key))

    def delete_prefix(self, prefix: str) -> None:
        path = self._path(prefix)
        self.fs.invalidate_cache(path)
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(path, recursive=True)

    def rename(self, src: str, dst: str) -> None:
        """A copy and a delete (not atomic: see :attr:`renames_atomically`)."""
        self.fs.mv(self._path(src), self._path(dst))

    def list_dir(self, prefix: str) -> list[str]:
        path = self._path(prefix)
        self.fs.invalidate_cache(path)  # listings are cached: a poller must see new entries
        try:
            listed = self.fs.ls(path, detail=False)
        except FileNotFoundError:
            return []
        return sorted({self._key(p).rsplit("/", 1)[-1] for p in listed} - {""})

    def files(self, prefix: str) -> list[FileInfo]:
        """Every object under ``prefix``."""
        path = self._path(prefix)
        self.fs.invalidate_cache(path)
        try:
            found = self.fs.find(path, detail=True, withdirs=False)
        except FileNotFoundError:
            return []
        return [(self._key(k), int(v.get("size") or 0), _mtime(v))
                for k, v in found.items() if v.get("type", "file") != "directory"]

    def root_files(self) -> list[FileInfo]:
        self.fs.invalidate_cache(self.base)
        try:
            listed = self.fs.ls(self.base, detail=True)
        except FileNotFoundError:
            return []
        return [(self._key(v["name"]), int(v.get("size") or 0), _mtime(v))
                for v in listed if v.get("type", "file") == "file"]

    def remove_empty_dirs(self, prefix: str, older_than: float) -> None:
        """Object stores have no directories to remove."""

    def invalidate(self, prefix: str) -> None:
        self.fs.invalidate_cache(self._path(prefix))

    def byte_source(self, key: str, name: str = "", checked: set[str] | None = None
                    ) -> FsspecByteSource:
        return FsspecByteSource(self.fs, self._path(key), name or repr(key))
