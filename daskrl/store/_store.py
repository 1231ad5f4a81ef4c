"""The trajectory store: batches as zarr v3 groups under an fsspec URL, made visible by commits.

Layout (format 2.0, see ``docs/store-format.md``)::

    <root>/zarr.json                        group; attributes["daskrl"] = format and version
    <root>/runs/<run:04d>/zarr.json         one group per collector run (its settings)
    <root>/batches/<id:012d>-<attempt>.zip  one zip container per write attempt: the batch's
                                            zarr group, arrays [T, E, ...]
    <root>/commits/<id:012d>/zarr.json      commit record: which attempt is *the* batch

A worker writes a batch as one file under a fresh attempt name (on local and shared POSIX
filesystems in place, with plain file I/O: see :mod:`daskrl.store._format.local_io`; elsewhere one put), then
creates the commit record with an atomic, exclusive create.  Readers list commits only, so a
batch is seen whole or not at all, and a retried task's second commit of the same id is detected
and dropped.  Stores of format 1.x (one directory tree per attempt, never released) are refused.
"""

from __future__ import annotations

import difflib
import errno
import json
import logging
import os
import re
import time
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import torch
from zarr.abc.store import RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import FsspecStore, LocalStore

from daskrl.config import Compression
from daskrl.errors import (
    BatchDataMissingError,
    BatchNotFoundError,
    StoreError,
    StoreFormatError,
    StoreRecordWarning,
    StoreURLError,
)
from daskrl.store._format import (
    BatchIndex,
    ByteSource,
    EncodedBatch,
    FileSource,
    ReadLimits,
    ShortReadError,
    ZipFormatError,
    encode_batch,
    local_io,
    read_batch,
    read_index,
)
from daskrl.store._handles import BatchHandle
from daskrl.store._housekeeping import StoreHousekeeping
from daskrl.store._reading import StoreReaders
from daskrl.store._records import check_attempt_path, check_commit_record, parse_document

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "TrajectoryStore", "normalize_url", "open_store"]

FORMAT_NAME = "daskrl.trajectories"
FORMAT_VERSION = "2.0"
READ_MAJORS = (2,)
"""Major format versions this daskrl reads; it writes only :data:`FORMAT_VERSION`'s."""
BATCH_IDS_PER_RUN = 1_000_000_000
"""Run ``r`` numbers its batches from ``r * BATCH_IDS_PER_RUN``."""
MAX_RUNS = -(-(2**39) // BATCH_IDS_PER_RUN)
"""Runs a store can number (550): batch ids stay below ``2**39``, so that episode ids
(``batch_id * 2**24 + ...``) fit a signed 64-bit integer."""

logger = logging.getLogger(__name__)

# storage_options by store URL, so handles (which carry no credentials) can load in this process.
_OPTIONS: dict[str, dict[str, Any]] = {}


def normalize_url(url: str | os.PathLike[str]) -> str:
    """``file://`` URL of an absolute path for local paths; other URLs unchanged."""
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str) or not url:
        raise StoreURLError(
            f"store must be a local path or an fsspec URL (a non-empty str or os.PathLike), "
            f"got {url!r}. Pass e.g. store='runs/demo' or store='s3://bucket/prefix'."
        )
    if "://" not in url:
        return "file://" + str(Path(url).expanduser().absolute())
    if url.startswith("file://"):
        return "file://" + str(Path(url[len("file://") :]).expanduser().absolute())
    return url.rstrip("/")


def check_store_options(url: str, storage_options: Any) -> dict[str, Any]:
    """Validate ``storage_options`` for the (normalized) store ``url`` and the URL's fsspec
    protocol, on the learner, before anything is opened; return the options as a dict."""
    if storage_options is None:
        storage_options = {}
    if not isinstance(storage_options, Mapping) or not all(
            isinstance(k, str) for k in storage_options):
        raise StoreURLError(
            f"storage_options must be a mapping with string keys (fsspec options such as "
            f"{{'anon': True}}) or None, got {type(storage_options).__name__} "
            f"{storage_options!r}. Parse a JSON text first: json.loads(text)."
        )
    if url.startswith("file://"):
        if storage_options:
            raise StoreURLError(
                f"store {url!r} is a local path, which takes no storage_options (they go to "
                f"fsspec backends such as s3://), got {sorted(storage_options)}. Drop them, "
                "or give the store's fsspec URL."
            )
        return {}
    for part in url.split("::"):  # chained URLs: "simplecache::s3://bucket/prefix"
        protocol = part.split("://", 1)[0] if "://" in part else part
        try:
            fsspec.get_filesystem_class(protocol)
        except ImportError as e:
            raise StoreError(
                f"cannot open store {url!r}: {e}. Install the fsspec backend for this protocol "
                "(e.g. pip install s3fs for s3://)."
            ) from e
        except ValueError:
            close = difflib.get_close_matches(protocol, fsspec.available_protocols(), n=3,
                                            cutoff=0.5)
            hint = f"Did you mean {' or '.join(repr(c + '://') for c in close)}? " if close else ""
            raise StoreURLError(
                f"store {url!r} names the unknown fsspec protocol {protocol!r}. {hint}Give a "
                "local path or a URL whose protocol fsspec knows (fsspec.available_protocols())."
            ) from None
    return dict(storage_options)


def _zarr_store(url: str, storage_options: Mapping[str, Any] | None, read_only: bool) -> Any:
    if url.startswith("file://"):
        # LocalStore writes a temp file and renames it: atomic on POSIX (fsspec's file:// is not).
        return LocalStore(url[len("file://") :], read_only=read_only)
    try:
        return FsspecStore.from_url(
            url, storage_options=dict(storage_options or {}), read_only=read_only
        )
    except ImportError as e:
        raise StoreError(
            f"cannot open store {url!r}: {e}. Install the fsspec backend for this protocol "
            "(e.g. pip install s3fs for s3://)."
        ) from e


def _json_bytes(doc: Mapping[str, Any]) -> Any:
    return default_buffer_prototype().buffer.from_bytes(json.dumps(doc, indent=1).encode())


def _group_doc(attributes: Mapping[str, Any]) -> dict[str, Any]:
    return {"zarr_format": 3, "node_type": "group", "attributes": dict(attributes)}


class TrajectoryStore(StoreReaders, StoreHousekeeping):
    """A daskrl store: write batches (workers), list and load them (learners, no cluster)."""

    def __init__(
        self,
        url: str | os.PathLike[str],
        storage_options: Mapping[str, Any] | None = None,
        *,
        read_only: bool = True,
        read_limits: ReadLimits | None = None,
    ) -> None:
        self.url = normalize_url(url)
        self.read_limits = read_limits or ReadLimits()
        """Bounds on what a batch may make a reader allocate (see ``docs/reading.md``)."""
        self.storage_options = check_store_options(self.url, storage_options)
        self.read_only = read_only
        self._zstore = _zarr_store(self.url, self.storage_options, read_only)
        self._commits: dict[int, dict[str, Any]] = {}
        self._skipped: dict[int, str] = {}
        """Commit records that cannot be read, by batch id: why."""
        self._skipped_runs: dict[int, str] = {}
        self._dirs_ok: set[str] = set()
        """Directories of a local store found to be real ones, not links (checked once per
        store object: the reader's rules are those of a store at rest)."""
        self._format_major: int | None = None
        if storage_options:
            _OPTIONS[self.url] = self.storage_options

    # -- low level ---------------------------------------------------------------------------
    def _get_json(self, key: str, what: str = "") -> dict[str, Any] | None:
        """The JSON object at ``key`` (None if missing): a regular file inside the store of at
        most :data:`~daskrl.store._format.local_io.MAX_DOCUMENT_BYTES` (:class:`StoreFormatError`
        otherwise, naming the document, ``what`` it is, and the store). An I/O error (or a
        backend refusing its options) is a :class:`StoreError` naming the store."""
        where = f"{what}{key!r} of store {self.url!r}"
        try:
            if isinstance(self._zstore, LocalStore):
                try:
                    raw = local_io.read_file(self._zstore.root, key, checked=self._dirs_ok)
                except local_io.UnsafeFileError as e:
                    raise local_io.UnsafeFileError(f"{where}: {e}") from None
            else:
                limit = local_io.MAX_DOCUMENT_BYTES
                try:  # a bounded read: a huge or endless object must not exhaust memory
                    buf = sync(self._zstore.get(key, prototype=default_buffer_prototype(),
                                                byte_range=RangeByteRequest(0, limit + 1)))
                except FileNotFoundError:  # a read-only LocalStore whose root does not exist
                    return None
                raw = None if buf is None else buf.to_bytes()
                if raw is not None and len(raw) > limit:
                    raise StoreFormatError(f"{where} holds more than {limit} bytes; a document "
                                           "holds at most that")
        except StoreError:
            raise
        except (OSError, TypeError) as e:  # TypeError: a backend refusing an unknown option
            raise self._access_error(f"read {key!r}", e) from e
        return None if raw is None else parse_document(raw, where)

    def _access_error(self, what: str, e: BaseException) -> StoreError:
        """A :class:`StoreError` for an I/O error (or a backend refusing its options) that
        names the store and says what to do."""
        if isinstance(e, TypeError):  # an fsspec backend refusing an option it does not know
            return StoreURLError(
                f"cannot {what} in store {self.url!r}: the fsspec backend refused its "
                f"storage_options ({e}). Check the option names "
                f"{sorted(self.storage_options)} against the backend's documentation."
            )
        if isinstance(e, PermissionError):
            local = self.url.startswith("file://")
            todo = ("Check the permissions of the store's directory." if local else
                    "Check the credentials in storage_options (key/secret, token, profile) "
                    "or the environment, and that they may read and write this prefix.")
            return StoreError(f"cannot {what} in store {self.url!r}: access denied ({e}). {todo}")
        full = getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
        todo = ("The store's filesystem is full: free space or use another store." if full else
                "Check that the store is reachable and writable.")
        return StoreError(f"cannot {what} in store {self.url!r} ({type(e).__name__}: {e}). {todo}")

    def _create_exclusive(self, key: str, doc: Mapping[str, Any]) -> bool:
        """Create ``key`` unless it exists; True if this call's document is the one stored."""
        self._check_writable(f"create {key!r}")
        data = _json_bytes(doc)
        if isinstance(self._zstore, LocalStore):  # temp file + link: atomic and exclusive
            return local_io.create_exclusive(self._zstore.root, key, data.to_bytes())
        if isinstance(self._zstore, FsspecStore) and _has_exclusive_create(self._zstore.fs):
            # zarr's generic set_if_not_exists checks, then writes: two writers can both win.
            # fsspec's mode="create" is a real exclusive create (S3: If-None-Match: *).
            try:
                sync(self._zstore.fs._pipe_file(f"{self._zstore.path}/{key}", data.to_bytes(),
                                                mode="create"))
                return True
            except FileExistsError:
                return False
        sync(self._zstore.set_if_not_exists(key, data))
        stored = self._get_json(key)
        return stored == json.loads(data.to_bytes())

    # -- layout ------------------------------------------------------------------------------
    def initialize(self, *, allow_non_empty: bool = False) -> None:
        """Create the root and its sub-groups if missing; check the format otherwise.

        A new store is not created in a directory (or under a prefix) that holds other things,
        unless ``allow_non_empty``: the store's garbage collector and its listings own its
        ``runs``, ``batches`` and ``commits`` (only those, and the root's ``zarr.json``).
        """
        root = self._get_json("zarr.json")
        if root is None:
            others = self._foreign_entries()
            if others and not allow_non_empty:
                shown = ", ".join(repr(n) for n in others[:5]) + (", ..." if len(others) > 5
                                                                  else "")
                raise StoreError(
                    f"cannot create a store at {self.url!r}: it already holds other things "
                    f"({shown}) and no daskrl store. Use a new or empty directory, or, to "
                    "create the store there on purpose, "
                    "TrajectoryStore(url, read_only=False).initialize(allow_non_empty=True) "
                    "first."
                )
            meta = {"daskrl": {"format": FORMAT_NAME, "format_version": FORMAT_VERSION}}
            try:
                self._create_exclusive("zarr.json", _group_doc(meta))
                for sub in ("runs", "batches", "commits"):
                    self._create_exclusive(f"{sub}/zarr.json", _group_doc({}))
            except OSError as e:
                raise StoreError(f"cannot create a store at {self.url!r}: {e}") from e
        self.check_format()
        self._check_write_format()

    def _foreign_entries(self) -> list[str]:
        """Names at the store's root that are not the store's own (sorted)."""
        try:
            if isinstance(self._zstore, LocalStore):
                names = local_io.listdir(self._zstore.root, "")
            else:
                async def _ls() -> list[str]:
                    return [k async for k in self._zstore.list_dir("")]

                names = sync(_ls())
        except OSError:  # not listable: creating it will say what is wrong
            return []
        return sorted(n for n in (k.rstrip("/") for k in names)
                      if n not in _OWN_ROOT_NAMES and not _ROOT_PARTIAL.fullmatch(n))

    def _check_write_format(self) -> None:
        if self._format_major is None:
            self.check_format()
        if self._format_major != int(FORMAT_VERSION.split(".")[0]):
            raise StoreFormatError(
                f"store {self.url!r} has format version {self._format_major}.x; this daskrl "
                f"writes only version {FORMAT_VERSION} (a batch is one zip container). Write "
                "to a new store; this daskrl still reads this one."
            )

    def check_format(self) -> None:
        """Raise :class:`StoreFormatError` unless this is a daskrl store this version reads."""
        root = self._get_json("zarr.json", "root record ")
        if root is None:
            raise StoreFormatError(
                f"no daskrl store at {self.url!r} (no zarr.json at its root). Check the URL, "
                "and that this machine sees the same filesystem as the workers."
            )
        attrs = root.get("attributes")
        info = attrs.get("daskrl") if isinstance(attrs, dict) else None
        if (
            root.get("zarr_format") != 3
            or not isinstance(info, dict)
            or info.get("format") != FORMAT_NAME
        ):
            raise StoreFormatError(
                f"{self.url!r} is a zarr hierarchy but not a daskrl store "
                f"(root attributes: {root.get('attributes')!r})."
            )
        major = str(info.get("format_version", "")).split(".")[0]
        if major == "1":
            raise StoreFormatError(
                f"store {self.url!r} has format version {info.get('format_version')!r} (a group "
                "directory per batch, a development format that was never released): it is "
                f"unsupported; this daskrl reads only version {FORMAT_VERSION}. Collect the "
                "data again with this daskrl."
            )
        if major not in {str(m) for m in READ_MAJORS}:
            raise StoreFormatError(
                f"store {self.url!r} has format version {info.get('format_version')!r}; this "
                f"daskrl reads versions {' and '.join(f'{m}.x' for m in READ_MAJORS)}. "
                "Upgrade daskrl."
            )
        self._format_major = int(major)

    def register_run(self, settings: Mapping[str, Any]) -> int:
        """Claim the next free run number (exclusive create) and record ``settings``.

        A store numbers at most :data:`MAX_RUNS` runs (run ``r``'s batch ids start at
        ``r * BATCH_IDS_PER_RUN``, and episode ids ``batch_id * 2**24 + ...`` must fit 64 bits).
        """
        run = self.next_run()
        while True:
            self._check_run_number(run)
            doc = _group_doc(
                {
                    "run": run,
                    "settings": dict(settings),
                    "started": time.time(),
                    "nonce": uuid.uuid4().hex,
                }
            )
            try:
                created = self._create_exclusive(f"runs/{run:04d}/zarr.json", doc)
            except OSError as e:
                raise StoreError(
                    f"cannot write to the store {self.url!r} ({type(e).__name__}: {e}). Check "
                    "that the path is writable and its filesystem not full or read-only."
                ) from e
            if created:
                return run
            run += 1

    def next_run(self) -> int:
        """The run number :meth:`register_run` would claim now; raises :class:`StoreError` if
        the store has none left (a check before a collector starts its cluster)."""
        existing = sorted(int(k) for k in self._list_groups("runs") if k.isdigit())
        run = existing[-1] + 1 if existing else 0
        self._check_run_number(run)
        return run

    def _check_run_number(self, run: int) -> None:
        if run >= MAX_RUNS:
            raise StoreError(
                f"store {self.url!r} has used all {MAX_RUNS} run numbers a store can have "
                f"(its newest run is {run - 1}; batch ids run * {BATCH_IDS_PER_RUN:_} + i "
                "must stay below 2**39 so that episode ids fit 64 bits). Collect into a new "
                "store; this one stays readable."
            )

    # -- reachability probes: does every worker see this very store? ---------------------------
    def write_probe(self, probe: str, name: str, token: str) -> None:
        """Leave a small marker under ``runs/probe-<probe>/`` (raises :class:`StoreError`).

        Probes run before a collector registers its run, so they are not under a run."""
        try:
            sync(self._zstore.set(f"runs/probe-{probe}/zarr.json", _json_bytes(_group_doc({}))))
            sync(self._zstore.set(_probe_key(probe, name),
                                  _json_bytes(_group_doc({"name": name, "token": token}))))
        except OSError as e:
            raise StoreError(
                f"{name} cannot write to the store {self.url!r} ({type(e).__name__}: {e}). "
                "Check that the path is writable there and its filesystem not full or "
                "read-only."
            ) from e

    def read_probe(self, probe: str, name: str) -> str | None:
        """The token of ``name``'s marker, or None if this process cannot see it."""
        doc = self._get_json(_probe_key(probe, name))
        return None if doc is None else doc["attributes"].get("token")

    def clear_probes(self, probe: str) -> None:
        """Remove the probe's markers."""
        self._delete_prefix(f"runs/probe-{probe}")

    def _list_groups(self, prefix: str) -> list[str]:
        async def _ls() -> list[str]:
            return [k async for k in self._zstore.list_dir(prefix + "/")]

        if isinstance(self._zstore, LocalStore):
            listed = local_io.listdir(self._zstore.root, prefix)
        else:
            listed = sync(_ls())
        return sorted(k.rstrip("/") for k in listed if k.rstrip("/") != "zarr.json")

    # -- writing (workers) -------------------------------------------------------------------
    def write_batch(
        self,
        batch_id: int,
        arrays: Mapping[str, np.ndarray],
        meta: Mapping[str, Any],
        compression: Compression = Compression.ZSTD,
    ) -> tuple[str, bool]:
        """Write a batch as one zip container under a fresh attempt name, then commit it.

        Returns ``(path, committed)``: ``committed`` is False when another attempt of the same
        batch id committed first (this attempt's file is then removed).
        """
        self._check_writable(f"write batch {batch_id}")
        self._check_write_format()
        key = f"commits/{batch_id:012d}/zarr.json"
        for _ in range(COMMIT_TRIES):
            path = f"batches/{batch_id:012d}-{uuid.uuid4().hex[:12]}.zip"
            full = {**meta, "batch_id": batch_id, "path": path}
            self._write_container(batch_id, path, encode_batch(full, arrays,
                                                               Compression(compression)))
            try:
                committed = self._create_exclusive(key, _group_doc(full))
            except FileNotFoundError:
                # The commit's temporary file (or its directory) was collected as garbage while
                # this writer was stalled: its container may be gone too. Write it again.
                self._delete_attempt(path)
                logger.warning("batch %d: the commit's temporary file of %r was removed by a "
                               "garbage collector; writing the batch again", batch_id, path)
                continue
            except OSError as e:  # e.g. ENOSPC: the container fitted, its commit record did not
                self._delete_attempt(path)
                if isinstance(e, StoreError):
                    raise
                raise self._access_error(
                    f"write the commit record of batch {batch_id} (the batch was not committed; "
                    "its container was removed)", e) from e
            if not committed:
                self._delete_attempt(path)
                return path, False
            # A writer stalled (stopped, suspended) between its container and its commit for
            # longer than the collector's grace period finds its container collected. The
            # commit must never name a container that is gone: check, undo and write again.
            if self._attempt_exists(path):
                return path, True
            self._undo_commit(batch_id, key, path)
            logger.warning("batch %d: container %r was removed by a garbage collector before "
                           "its commit; writing the batch again", batch_id, path)
        raise StoreError(
            f"cannot commit batch {batch_id} to {self.url!r}: a garbage collector removed this "
            f"writer's container {COMMIT_TRIES} times before its commit. The collector's grace "
            "period (collect_garbage(older_than=...), daskrl gc --older-than) must be longer "
            "than any stall of a writer (a stopped process, a suspended job, a paused VM)."
        )

    def _write_container(self, batch_id: int, path: str, entries: EncodedBatch) -> None:
        try:
            if isinstance(self._zstore, LocalStore):
                # In place (the attempt is invisible until committed); see daskrl.store._format.local_io.
                self._write_local(os.path.join(self._zstore.root, path), entries)
            else:
                data = b"".join(entries.parts())
                sync(self._zstore.set(path, default_buffer_prototype().buffer.from_bytes(data)))
        except ZipFormatError as e:
            raise StoreError(f"cannot write batch {batch_id} to {self.url!r}: {e}.") from e
        except OSError as e:
            raise StoreError(f"cannot write batch {batch_id} to {self.url!r}: {e}") from e

    def _attempt_exists(self, path: str) -> bool:
        """Whether the container ``path`` is there now (no cached listing)."""
        if isinstance(self._zstore, LocalStore):
            return os.path.isfile(os.path.join(self._zstore.root, path))
        if isinstance(self._zstore, FsspecStore):
            full = f"{self._zstore.path}/{path}"
            self._zstore.fs.invalidate_cache(full)
            return bool(sync(self._zstore.fs._exists(full)))
        return bool(sync(self._zstore.exists(path)))

    def _undo_commit(self, batch_id: int, key: str, path: str) -> None:
        """Remove this writer's own commit record of ``path`` (its container is gone)."""
        try:
            sync(self._zstore.delete(key))
        except OSError as e:
            raise StoreError(
                f"batch {batch_id} of {self.url!r}: its container {path!r} was removed by a "
                f"garbage collector before its commit, and the commit record {key!r} could not "
                f"be removed ({e}). Delete the batch (store.delete_batches([{batch_id}]))."
            ) from e

    @staticmethod
    def _write_local(file: str, batch: EncodedBatch) -> None:
        """A container into a new local file: small ones with one ``pwritev``; large ones with
        their members' data written by the thread pool while their CRC-32s are computed, then
        the headers and the directory (which need the CRCs)."""
        if batch.nbytes < _PARALLEL_WRITE_BYTES:
            local_io.write_new_file(file, batch.parts())
            return
        pool = local_io.thread_pool()
        data = batch.data_pieces()
        crcs = [pool.submit(batch.member_crc, i) for i in range(len(batch.entries))]
        local_io.write_new_file_at(file, data, pool,
                                   lambda: batch.header_pieces([f.result() for f in crcs]))

    def _delete_attempt(self, path: str) -> None:
        """Remove an attempt: a container (2.x) or a directory tree (1.x)."""
        try:
            if path.endswith(".zip"):
                sync(self._zstore.delete(path))
            else:
                sync(self._zstore.delete_dir(path))
        except Exception:  # debris only: a garbage collector can remove it later
            pass

    def _delete_prefix(self, path: str) -> None:
        try:
            sync(self._zstore.delete_dir(path))
        except Exception:  # debris only: a garbage collector can remove it later
            pass

    # -- reading -----------------------------------------------------------------------------
    def refresh(self) -> None:
        """Pick up batches committed, and drop batches deleted, since the last look."""
        if isinstance(self._zstore, FsspecStore):
            # s3fs and others cache listings: without this a poller never sees new commits.
            self._zstore.fs.invalidate_cache(f"{self._zstore.path}/commits")
        # Only commit directories (12 digits) count: debris such as zarr.<hex>.partial does not.
        listed = {int(k) for k in self._list_groups("commits") if k.isdigit() and len(k) == 12}
        if isinstance(self._zstore, LocalStore):
            # A directory outlives its record for a moment while a batch is deleted.
            root = Path(self._zstore.root) / "commits"
            # (lexists: a record that is a link or a special file is listed, then refused)
            listed = {b for b in listed if os.path.lexists(root / f"{b:012d}" / "zarr.json")}
        for bid in set(self._commits) - listed:
            del self._commits[bid]
        for bid in set(self._skipped) - listed:
            del self._skipped[bid]
        fresh = []
        for bid in sorted(listed - set(self._commits)):  # new records, and bad ones again
            key = f"commits/{bid:012d}/zarr.json"
            try:
                doc = self._get_json(key, "commit record ")
                if doc is not None:
                    self._commits[bid] = check_commit_record(
                        doc, bid, f"commit record {key!r} of store {self.url!r}")
                self._skipped.pop(bid, None)  # repaired, or gone
            except StoreFormatError as e:  # one bad record must not hide the good ones
                if bid not in self._skipped:
                    fresh.append(bid)  # reported once
                self._skipped[bid] = str(e)
        if fresh:
            warnings.warn(StoreRecordWarning(
                f"store {self.url!r}: skipped {len(fresh)} unreadable commit record(s) of "
                f"batches {fresh[:10]}{' ...' if len(fresh) > 10 else ''}: "
                f"{self._skipped[fresh[0]]} (all: store.skipped_records())"), stacklevel=3)

    def skipped_records(self) -> dict[str, str]:
        """Records that listings skip because they cannot be read (garbage, truncated, wrongly
        typed, or naming a path that is not the batch's own), by key (``commits/<id>/zarr.json``,
        ``runs/<run>/zarr.json``): what is wrong with each.  Loading such a batch raises
        :class:`StoreFormatError`."""
        self.refresh()
        self.runs()
        out = {f"commits/{bid:012d}/zarr.json": why for bid, why in self._skipped.items()}
        out.update({f"runs/{run:04d}/zarr.json": why for run, why in self._skipped_runs.items()})
        return dict(sorted(out.items()))

    def _still_committed(self, batch_id: int, path: str) -> bool:
        """The commit record of ``batch_id`` still names ``path`` (re-read now)."""
        try:
            self._check_still_committed(batch_id, path)
        except BatchNotFoundError:
            return False
        return True

    def _data_missing(self, batch_id: int, path: str) -> BatchDataMissingError:
        return BatchDataMissingError(
            f"batch {batch_id} ({path!r}) of {self.url!r} is committed but its data is "
            "missing: the store is damaged (the container was deleted or moved by something "
            "other than daskrl). Restore it from a copy, or delete the batch: "
            f"open_store(url, writable=True).delete_batches([{batch_id}])."
        )

    def batch_ids(self) -> list[int]:
        """Committed batch ids, ascending."""
        self.refresh()
        return sorted(self._commits)

    def __len__(self) -> int:
        return len(self.batch_ids())

    def __iter__(self) -> Iterator[BatchHandle]:
        for bid in self.batch_ids():
            yield self.handle(bid)

    @property
    def frames(self) -> int:
        """Frames in all committed batches."""
        self.refresh()
        return sum(int(c["frames"]) for c in self._commits.values())

    def handle(self, batch_id: int) -> BatchHandle:
        """The :class:`BatchHandle` of a committed batch."""
        return BatchHandle.from_record(self.url, self._record(batch_id))

    def _record(self, batch_id: int) -> dict[str, Any]:
        if batch_id not in self._commits:
            self.refresh()
        if batch_id in self._skipped:
            raise StoreFormatError(self._skipped[batch_id])
        if batch_id not in self._commits:
            raise BatchNotFoundError(
                f"no committed batch {batch_id} in store {self.url!r} "
                f"({len(self._commits)} batches; ids via store.batch_ids())."
            )
        return self._commits[batch_id]

    def load(
        self,
        batch_id: int,
        device: torch.device | str | None = None,
        keys: Sequence[str] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Load batch ``batch_id`` as ``{key: tensor [T, E, ...]}`` on ``device``."""
        return self.load_path(self._record(batch_id)["path"], device, keys)

    def load_path(
        self, path: str, device: torch.device | str | None = None,
        keys: Sequence[str] | None = None, batch_id: int | None = None,
    ) -> dict[str, torch.Tensor]:
        """Load the batch at ``path`` (as named by a commit record): a zip container.

        The container and every array's metadata (the allowlist) are checked before any data
        is read (:mod:`daskrl.store._format`), within :attr:`read_limits`; each array is
        decoded straight into one tensor (pinned when ``device`` is CUDA) and moved to
        ``device`` with one copy.  ``path`` must be an attempt
        ``batches/<id:012d>-<attempt>.zip`` (of ``batch_id`` when given); anything else is
        refused (:class:`StoreFormatError`).
        """
        check_attempt_path(path, batch_id, f"batch path {path!r} of store {self.url!r}")
        batch_id = _batch_id_of(path)
        where = f"batch {batch_id} ({path!r})" if batch_id is not None else f"batch {path!r}"
        dev = torch.device(device) if device is not None else torch.device("cpu")
        try:
            if not path.endswith(".zip"):
                raise StoreFormatError(f"{where} of {self.url!r} is not a zip container (format "
                                       "1.x, never released, is unsupported).")
            out = _load_tensors(self._batch_source(path, where), keys, dev, self.read_limits)
        except BatchDataMissingError:
            self._check_still_committed(batch_id, path)  # deleted under the read?
            raise self._data_missing(batch_id, path) from None
        except (KeyError, StoreError):
            self._check_still_committed(batch_id, path)  # deleted under the read?
            raise
        # Deletion removes the commit record first, then the data: if the record still names
        # this attempt now, nothing was deleted under the read (no chunk read as a missing
        # all-zero chunk by mistake).
        self._check_still_committed(batch_id, path)
        return out

    def _batch_source(self, path: str, where: str) -> ByteSource:
        """The container ``path`` as a byte source (close it after use)."""
        if isinstance(self._zstore, LocalStore):
            return FileSource(self._zstore.root, path, where, self._dirs_ok)
        return _ZarrStoreSource(self._zstore, path, where)

    def _batch_index(self, path: str, where: str, names: Sequence[str] | None = None
                     ) -> BatchIndex:
        """The validated index of the container ``path`` (layouts of ``names``, default all)."""
        src = self._batch_source(path, where)
        try:
            return read_index(src, names, limits=self.read_limits)
        finally:
            src.close()

    def _check_still_committed(self, batch_id: int | None, path: str) -> None:
        if batch_id is None:
            return
        rec = self._get_json(f"commits/{batch_id:012d}/zarr.json")
        attrs = rec.get("attributes") if rec is not None else None
        if not isinstance(attrs, dict) or attrs.get("path") != path:
            self._commits.pop(batch_id, None)
            raise BatchNotFoundError(
                f"batch {batch_id} of {self.url!r} was deleted while it was being read "
                f"({path!r} is no longer committed)."
            )


_OWN_ROOT_NAMES = frozenset({"zarr.json", "runs", "batches", "commits", "lost+found"})
"""What may be at the root of a directory a new store is created in (``lost+found``: the
root of a fresh filesystem)."""
_ROOT_PARTIAL = re.compile(r"zarr\.[0-9a-f]{32}\.partial")

COMMIT_TRIES = 3
"""Times a writer writes a batch again after a garbage collector removed its container (or
its commit's temporary file) before the commit, before it gives up."""

_PARALLEL_WRITE_BYTES = 4 << 20
"""Local batches at least this large are written by the thread pool while their CRC-32s are
computed (zlib releases the GIL)."""

_EXCLUSIVE_PROTOCOLS = frozenset({"s3", "s3a", "memory"})
"""fsspec protocols whose ``pipe_file(mode="create")`` is known to be an exclusive create
(s3fs sends ``If-None-Match: *``); others may ignore the mode and overwrite."""


def _probe_key(probe: str, name: str) -> str:
    """Key of ``name``'s reachability marker (a worker address made path-safe)."""
    slug = "".join(c if c.isalnum() else "-" for c in name)
    return f"runs/probe-{probe}/{slug}/zarr.json"


def _has_exclusive_create(fs: Any) -> bool:
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return bool(_EXCLUSIVE_PROTOCOLS.intersection(protocols))


def _batch_id_of(path: str) -> int | None:
    """Batch id of an attempt path ``batches/<id:012d>-<attempt>[.zip]`` (None for others)."""
    parts = path.split("/")
    if len(parts) == 2 and parts[0] == "batches" and parts[1][:12].isdigit():
        return int(parts[1][:12])
    return None


def open_store(
    url: str | os.PathLike[str],
    storage_options: Mapping[str, Any] | None = None,
    *,
    writable: bool = False,
    read_limits: ReadLimits | None = None,
) -> TrajectoryStore:
    """Open an existing daskrl store; no cluster needed.

    ``writable=True`` allows housekeeping (``delete_batches``, ``keep_last``,
    ``collect_garbage``); reading never needs it.  ``read_limits`` raises the bounds a reader
    puts on a batch (:class:`~daskrl.store.ReadLimits`), for trusted stores of large batches.
    """
    store = TrajectoryStore(url, storage_options, read_only=not writable, read_limits=read_limits)
    store.check_format()
    return store


def options_for(url: str) -> dict[str, Any]:
    """storage_options registered in this process for ``url`` (never stored in handles)."""
    return _OPTIONS.get(url, {})


def _load_tensors(src: ByteSource, keys: Sequence[str] | None, dev: torch.device,
                  limits: ReadLimits) -> dict[str, torch.Tensor]:
    """The arrays ``keys`` of the container ``src`` as tensors on ``dev`` (closes ``src``).

    Arrays are read into numpy memory (malloc reuses freed memory; torch's allocator maps fresh
    pages, whose first touch costs more than reading a batch from the page cache), or, for a
    CUDA target, into pinned tensors moved with one copy each."""
    pinned: dict[str, torch.Tensor] = {}

    def pin(name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        t = torch.empty(shape, dtype=torch.from_numpy(np.empty(0, dtype)).dtype, pin_memory=True)
        pinned[name] = t
        return t.numpy()

    use_pin = dev.type == "cuda" and torch.cuda.is_available()
    try:
        index = read_index(src, [] if keys is not None else None, limits=limits)
        arrays = read_batch(src, index, keys, limits=limits, allocate=pin if use_pin else None)
    finally:
        src.close()
    if dev.type == "cpu":
        return {k: torch.from_numpy(a) for k, a in arrays.items()}
    return {k: (pinned[k] if use_pin else torch.from_numpy(a)).to(dev) for k, a in arrays.items()}


class _ZarrStoreSource:
    """A container in a (non-local) zarr store as a :class:`ByteSource`, through the store's
    ranged gets.  (An adapter until the store's backends provide their own sources.)"""

    def __init__(self, zstore: Any, key: str, name: str) -> None:
        self.name, self._zstore, self._key = name, zstore, key
        self._size: int | None = None

    def _missing(self) -> BatchDataMissingError:
        return BatchDataMissingError(f"{self.name}: the container {self._key!r} is missing.")

    def size(self) -> int:
        if self._size is None:
            try:
                self._size = int(sync(self._zstore.getsize(self._key)))
            except FileNotFoundError:
                raise self._missing() from None
        return self._size

    def tail(self, n: int) -> bytes:
        buf = sync(self._zstore.get(self._key, default_buffer_prototype(), SuffixByteRequest(n)))
        if buf is None:
            raise self._missing()
        data = bytes(buf.to_bytes())
        if len(data) < n:  # the whole object: its size is known
            self._size = len(data)
        return data

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        if not ranges:
            return []
        bufs = sync(self._zstore.get_partial_values(
            default_buffer_prototype(),
            [(self._key, RangeByteRequest(a, a + n)) for a, n in ranges]))
        out = []
        for (a, n), buf in zip(ranges, bufs):
            data = b"" if buf is None else bytes(buf.to_bytes())
            if len(data) != n:
                raise ShortReadError(f"bytes {a}..{a + n} lie past the end of the object")
            out.append(data)
        return out

    def fileno(self) -> int | None:
        return None

    def close(self) -> None:
        pass
