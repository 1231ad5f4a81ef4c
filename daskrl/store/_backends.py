"""Where a store's bytes live: one small class per storage backend behind one protocol.

:class:`Backend` (:mod:`._backend`) names what a backend can do, so callers never ask which
one they hold: :class:`LocalBackend` (:mod:`._backend_local`: a POSIX directory, plain file I/O
with ``O_NOFOLLOW`` and no special files, see :mod:`daskrl.store._format.local_io`) and
:class:`FsspecBackend` (:mod:`._backend_fsspec`: any fsspec filesystem, through fsspec's public
synchronous API).
``backend.byte_source(key)`` opens the :class:`ByteSource` the format code reads a container
through.  zarr's storage classes are not used at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from daskrl.store._backend import Backend, ByteSource, FileInfo
from daskrl.store._backend_fsspec import FsspecBackend
from daskrl.store._backend_local import LocalBackend
from daskrl.store._url import is_local

__all__ = ["Backend", "ByteSource", "FileInfo", "FsspecBackend", "LocalBackend", "open_backend"]


def open_backend(url: str, storage_options: Mapping[str, Any], read_only: bool) -> Backend:
    """The backend of the (normalized) store ``url``."""
    if is_local(url):
        return LocalBackend(url, read_only)
    return FsspecBackend(url, storage_options, read_only)
