"""Plain file I/O for stores on a local (or POSIX shared) filesystem, without an event loop.

zarr's ``LocalStore`` runs every get and set through its event-loop thread and a thread hop
(and writes each file as temp + rename), which is most of the cost of writing or reading a
batch of a few thousand frames of low-dimensional observations.  The commit protocol makes most
of that unnecessary:

* an attempt's container (``batches/<id>-<attempt>.zip``) is written in place with an exclusive create (never overwriting
  anything): its name is fresh, and no reader looks at it before its commit record exists, so a
  torn file is never seen (a crash leaves an uncommitted attempt for the garbage collector);
* the commit record is the one write that must be atomic *and* exclusive: it is written to a
  temporary ``zarr.<hex>.partial`` file beside it and hard-linked into place (``link`` fails if
  the record exists; the same scheme as zarr's ``LocalStore``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import os
import stat
import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from daskrl.errors import StoreFormatError

__all__ = ["MAX_DOCUMENT_BYTES", "FileIdentity", "UnsafeFileError", "check_dirs",
           "create_exclusive", "file_identity", "listdir", "open_regular", "read_file",
           "read_file_identified", "thread_pool", "write_new_file", "write_new_file_at"]

_IOV_MAX = 512
_POOLS: dict[str, tuple[int, concurrent.futures.ThreadPoolExecutor]] = {}
_POOL_LOCK = threading.Lock()


def _cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def thread_pool(kind: str = "io") -> concurrent.futures.ThreadPoolExecutor:
    """This process's pool of ``kind``: ``"io"`` for chunk writes that wait on the filesystem
    (a few more threads than CPUs), ``"cpu"`` for reads checked and decoded in memory (one
    thread per CPU: more only contend for the caches, and read a large batch slower).
    Pools are recreated after a fork, whose child has none of the parent's threads."""
    with _POOL_LOCK:
        pool = _POOLS.get(kind)
        if pool is None or pool[0] != os.getpid():
            workers = _cpus() if kind == "cpu" else min(16, _cpus() + 4)
            pool = _POOLS[kind] = (os.getpid(), concurrent.futures.ThreadPoolExecutor(
                workers, thread_name_prefix=f"daskrl-{kind}"))
        return pool[1]


MAX_DOCUMENT_BYTES = 1 << 20
"""Largest JSON document (root, run, commit record, array ``zarr.json``) a reader accepts;
daskrl writes a few KiB at most."""

_READ_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
               | getattr(os, "O_CLOEXEC", 0))


class UnsafeFileError(StoreFormatError):
    """A path inside a store is a symbolic link, a FIFO, a device, another non-regular file, or
    a document larger than any daskrl writes: readers refuse it."""


def check_dirs(root: Path | str, key: str, checked: set[str] | None = None) -> None:
    """Refuse ``key`` unless every directory between ``root`` and it is a real directory (no
    symbolic link: a store's contents must lie inside it).  ``checked`` holds directories
    already found good (shared across calls to check a tree once)."""
    parts = key.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if checked is not None and d in checked:
            continue
        try:
            st = os.lstat(os.path.join(root, d))
        except (FileNotFoundError, NotADirectoryError):
            return  # the open that follows reports it missing
        if not stat.S_ISDIR(st.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
            raise UnsafeFileError(f"{d!r} in the store is {kind}; daskrl never follows links "
                                  "inside a store (everything it reads must lie inside it)")
        if checked is not None:
            checked.add(d)


def open_regular(root: Path | str, key: str, checked: set[str] | None = None) -> int:
    """Open ``root/key`` for reading, refusing anything but a regular file inside the store:
    no symbolic link (``O_NOFOLLOW``, and :func:`check_dirs` for its directories), no FIFO or
    device (opened with ``O_NONBLOCK`` so that a FIFO cannot block the open, then ``fstat``).

    Raises ``FileNotFoundError`` (or ``NotADirectoryError``) if it does not exist and
    :class:`UnsafeFileError` for anything else that is not a regular file.
    """
    return _open_regular(root, key, checked)[0]


def _open_regular(root: Path | str, key: str, checked: set[str] | None = None
                  ) -> tuple[int, os.stat_result]:
    check_dirs(root, key, checked)
    try:
        fd = os.open(os.path.join(root, key), _READ_FLAGS)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafeFileError(f"{key!r} in the store is a symbolic link; daskrl never "
                                  "follows links inside a store") from None
        raise
    # O_NONBLOCK stays set: it changes nothing for reads of a regular file
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafeFileError(f"{key!r} in the store is {_kind(st.st_mode)}, not a regular file")
    return fd, st


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return f"a special file (mode {mode:#o})"


def read_file(root: Path | str, key: str, max_bytes: int = MAX_DOCUMENT_BYTES,
              checked: set[str] | None = None) -> bytes | None:
    """Contents of the regular file ``root/key`` (see :func:`open_regular`); None if it does
    not exist.  Raises :class:`UnsafeFileError` for a link or special file, or a file of more
    than ``max_bytes``."""
    got = read_file_identified(root, key, max_bytes, checked)
    return None if got is None else got[0]


FileIdentity = tuple[int, int, int, int, int]
"""``(device, inode, size, mtime_ns, ctime_ns)`` of a file: a write in place changes the times
(the ctime cannot be set back), a replacement the inode."""


def _identity(st: os.stat_result) -> FileIdentity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def file_identity(root: Path | str, key: str) -> FileIdentity | None:
    """The identity of ``root/key`` itself (a link's own, not its target's); None if missing."""
    try:
        return _identity(os.lstat(os.path.join(root, key)))
    except (FileNotFoundError, NotADirectoryError):
        return None


def read_file_identified(root: Path | str, key: str, max_bytes: int = MAX_DOCUMENT_BYTES,
                         checked: set[str] | None = None) -> tuple[bytes, FileIdentity] | None:
    """:func:`read_file`, with the identity of the file read (from its open descriptor)."""
    try:
        fd, st = _open_regular(root, key, checked)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        size = st.st_size
        if size > max_bytes:
            raise UnsafeFileError(f"{key!r} in the store holds {size} bytes; a document holds "
                                  f"at most {max_bytes}")
        data = os.read(fd, max_bytes + 1)
        while len(data) <= max_bytes:  # short reads (network filesystems) until end of file
            more = os.read(fd, max_bytes + 1 - len(data))
            if not more:
                break
            data += more
        if len(data) > max_bytes:
            raise UnsafeFileError(f"{key!r} in the store holds more than {max_bytes} bytes; "
                                  "a document holds at most that")
        return data, _identity(st)  # as opened: a change since shows as another identity
    finally:
        os.close(fd)


def listdir(root: Path, key: str) -> list[str]:
    """Names in the directory ``root/key`` (empty if it does not exist)."""
    try:
        return os.listdir(os.path.join(root, key))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _write_one(path: str, parts: Sequence[Any]) -> None:
    with open(path, "xb", buffering=0) as f:
        for part in parts:
            view = memoryview(part).cast("B")
            while view:  # a raw file may write less than asked
                view = view[f.write(view):]


def byte_views(buffers: Sequence[Any]) -> list[memoryview]:
    """Flat byte views of the non-empty ``buffers``, for vectored I/O."""
    views = [memoryview(b).cast("B") for b in buffers]
    return [v for v in views if v.nbytes]


def advance(views: list[memoryview], n: int) -> None:
    """Drop the first ``n`` bytes of ``views`` in place: what a vectored read or write that
    moved only ``n`` bytes has done."""
    while views and n >= views[0].nbytes:
        n -= views[0].nbytes
        views.pop(0)
    if n:
        views[0] = views[0][n:]


def _pwrite_all(fd: int, parts: Sequence[Any], offset: int) -> None:
    views = byte_views(parts)
    while views:
        n = os.pwritev(fd, views[:_IOV_MAX], offset)  # may write less than asked
        offset += n
        advance(views, n)


def _create(path: str) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(path, flags, 0o644)
    except FileNotFoundError:  # the first write into a new directory: one mkdir, not one per file
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return os.open(path, flags, 0o644)


def write_new_file(path: str, parts: Sequence[Any]) -> None:
    """Create the file ``path`` (it must not exist: ``FileExistsError``) holding ``parts``
    joined, with one exclusive create and (usually) one ``pwritev``; its directory is created
    if missing."""
    fd = _create(path)
    try:
        _pwrite_all(fd, parts, 0)
    except BaseException:
        os.unlink(path)  # ours (exclusive create), and never committed
        raise
    finally:
        os.close(fd)


def write_new_file_at(
    path: str,
    pieces: Sequence[tuple[int, Sequence[Any]]],
    pool: concurrent.futures.Executor,
    finish: Callable[[], Sequence[tuple[int, Sequence[Any]]]],
) -> None:
    """Create the file ``path`` exclusively and write each ``(offset, buffers)`` of ``pieces``
    by ``pool`` (``pwritev`` releases the GIL); then the pieces ``finish()`` returns (it runs
    meanwhile on this thread, e.g. waiting for checksums that headers need)."""
    fd = _create(path)
    try:
        futures = [pool.submit(_pwrite_all, fd, parts, offset) for offset, parts in pieces]
        try:
            last = finish()
        finally:
            concurrent.futures.wait(futures)  # all done before the descriptor is closed
        for fut in futures:
            fut.result()
        for offset, parts in last:
            _pwrite_all(fd, parts, offset)
    except BaseException:
        os.unlink(path)  # ours (exclusive create), and never committed
        raise
    finally:
        os.close(fd)


def create_exclusive(root: Path, key: str, data: bytes) -> bool:
    """Atomically create ``root/key`` with ``data`` unless it exists; True if this call did."""
    path = os.path.join(root, key)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    base, _ = os.path.splitext(path)
    tmp = f"{base}.{uuid.uuid4().hex}.partial"
    with open(tmp, "xb") as f:
        f.write(data)
    try:
        os.link(tmp, path)  # atomic; fails if ``path`` exists
        return True
    except FileExistsError:
        return False
    finally:
        # Gone already if a garbage collector took it for debris while this writer stalled
        # (the link, if made, is the record: the temporary name does not matter).
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
