"""A store on any fsspec filesystem (object stores, ``memory://``), through fsspec's public
synchronous API: the only module of daskrl that uses fsspec directly."""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import fsspec

from daskrl.errors import BatchDataMissingError, StoreError
from daskrl.store._backend import FileInfo
from daskrl.store._format import EncodedBatch, ShortReadError

__all__ = ["FsspecBackend", "FsspecByteSource"]

_EXCLUSIVE_PROTOCOLS = frozenset({"s3", "s3a", "memory"})
"""fsspec protocols whose ``pipe_file(mode="create")`` is known to be an exclusive create
(s3fs sends ``If-None-Match: *``); others may ignore the mode and overwrite."""


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
