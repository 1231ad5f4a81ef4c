"""A store in a local (or shared POSIX) directory: plain file I/O with ``O_NOFOLLOW`` and no
special files (:mod:`daskrl.store._format.local_io`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

from daskrl.store._backend import FileInfo
from daskrl.store._format import EncodedBatch, FileSource, local_io
from daskrl.store._url import local_path

__all__ = ["LocalBackend"]

_PARALLEL_WRITE_BYTES = 4 << 20
"""Local containers at least this large are written by the thread pool while their CRC-32s are
computed (zlib releases the GIL)."""


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
