"""A store's JSON documents (root, run and commit records, probes) over its backend, and the
errors that name the store: every read is bounded and checked, every I/O error says what to do."""

from __future__ import annotations

import errno
import json
from collections.abc import Hashable, Mapping
from typing import Any

from daskrl.errors import StoreError, StoreFormatError, StoreURLError
from daskrl.store._backends import Backend
from daskrl.store._format import local_io
from daskrl.store._layout import GROUP_DOC
from daskrl.store._records import parse_document
from daskrl.store._url import is_local

__all__ = ["Documents"]


def _json_bytes(doc: Mapping[str, Any]) -> bytes:
    # one line: json's C encoder (an indented document takes its pure-Python one, ~3x slower,
    # and a commit record is written with every batch)
    return json.dumps(doc).encode()


class Documents:
    """Read, write and list the JSON documents of one store."""

    def __init__(self, backend: Backend, url: str, storage_options: Mapping[str, Any],
                 read_only: bool) -> None:
        self.backend = backend
        self.url = url
        self.options = storage_options
        self.read_only = read_only
        self.checked: set[str] = set()
        """Directories of a local store found to be real ones, not links (checked once per
        store object: the reader's rules are those of a store at rest)."""

    def get(self, key: str, what: str = "") -> dict[str, Any] | None:
        """The JSON object at ``key`` (None if missing): a regular file inside the store of at
        most :data:`~daskrl.store._format.local_io.MAX_DOCUMENT_BYTES` (:class:`StoreFormatError`
        otherwise, naming the document, ``what`` it is, and the store). An I/O error (or a
        backend refusing its options) is a :class:`StoreError` naming the store."""
        return self.get_identified(key, what)[0]

    def get_identified(self, key: str, what: str = ""
                       ) -> tuple[dict[str, Any] | None, Hashable | None]:
        """:meth:`get`, and the identity of what was read (the backend's ``identity``; None
        where the backend has none)."""
        where = f"{what}{key!r} of store {self.url!r}"
        limit = local_io.MAX_DOCUMENT_BYTES
        try:
            raw, ident = self.backend.read_document_identified(key, limit, self.checked)
        except local_io.UnsafeFileError as e:
            raise local_io.UnsafeFileError(f"{where}: {e}") from None
        except StoreError:
            raise
        except (OSError, TypeError) as e:  # TypeError: a backend refusing an unknown option
            raise self.access_error(f"read {key!r}", e) from e
        if raw is not None and len(raw) > limit:
            raise StoreFormatError(f"{where} holds more than {limit} bytes; a document holds "
                                   "at most that")
        return (None, None) if raw is None else (parse_document(raw, where), ident)

    def identity(self, key: str) -> Hashable | None:
        """The backend's identity of ``key`` now (None: missing, or the backend has none)."""
        try:
            return self.backend.identity(key)
        except OSError:
            return None  # the caller reads the document itself, and reports what is wrong

    def put(self, key: str, doc: Mapping[str, Any]) -> None:
        """Write ``doc`` at ``key`` (atomically replacing what is there)."""
        self.backend.put(key, _json_bytes(doc))

    def create_exclusive(self, key: str, doc: Mapping[str, Any]) -> bool:
        """Create ``key`` unless it exists; True if this call's document is the one stored."""
        self.check_writable(f"create {key!r}")
        return self.backend.create_exclusive(key, _json_bytes(doc))

    def list_groups(self, prefix: str) -> list[str]:
        """Names under ``prefix`` (sorted), without its own document."""
        return sorted(k.rstrip("/") for k in self.backend.list_dir(prefix)
                      if k.rstrip("/") != GROUP_DOC)

    def check_writable(self, what: str) -> None:
        if self.read_only:
            raise StoreError(
                f"cannot {what}: store {self.url!r} was opened read-only. Open it with "
                "daskrl.open_store(url, writable=True)."
            )

    def access_error(self, what: str, e: BaseException) -> StoreError:
        """A :class:`StoreError` for an I/O error (or a backend refusing its options) that
        names the store and says what to do."""
        if isinstance(e, TypeError):  # an fsspec backend refusing an option it does not know
            return StoreURLError(
                f"cannot {what} in store {self.url!r}: the fsspec backend refused its "
                f"storage_options ({e}). Check the option names "
                f"{sorted(self.options)} against the backend's documentation."
            )
        if isinstance(e, PermissionError):
            todo = ("Check the permissions of the store's directory." if is_local(self.url) else
                    "Check the credentials in storage_options (key/secret, token, profile) "
                    "or the environment, and that they may read and write this prefix.")
            return StoreError(f"cannot {what} in store {self.url!r}: access denied ({e}). {todo}")
        full = getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
        todo = ("The store's filesystem is full: free space or use another store." if full else
                "Check that the store is reachable and writable.")
        return StoreError(f"cannot {what} in store {self.url!r} ({type(e).__name__}: {e}). {todo}")
