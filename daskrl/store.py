"""The trajectory store: batches as zarr v3 groups under an fsspec URL, made visible by commits.

Layout (format 2.0, see ``docs/store-format.md``)::

    <root>/zarr.json                        group; attributes["daskrl"] = format and version
    <root>/runs/<run:04d>/zarr.json         one group per collector run (its settings)
    <root>/batches/<id:012d>-<attempt>.zip  one zip container per write attempt: the batch's
                                            zarr group, arrays [T, E, ...]
    <root>/commits/<id:012d>/zarr.json      commit record: which attempt is *the* batch

A worker writes a batch as one file under a fresh attempt name (on local and shared POSIX
filesystems in place, with plain file I/O: see :mod:`daskrl.local_io`; elsewhere one put), then
creates the commit record with an atomic, exclusive create.  Readers list commits only, so a
batch is seen whole or not at all, and a retried task's second commit of the same id is detected
and dropped.  Stores of format 1.x (one directory tree per attempt) are still read.
"""

from __future__ import annotations

import json
import os
import time
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from zarr.abc.store import RangeByteRequest
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import FsspecStore, LocalStore

from . import local_io
from .config import Compression
from .errors import (
    BatchDataMissingError,
    BatchNotFoundError,
    StoreError,
    StoreFormatError,
    StoreRecordWarning,
)
from .handles import BatchHandle
from .housekeeping import StoreHousekeeping
from .readers import StoreReaders
from .records import check_attempt_path, check_commit_record, parse_document
from .zarr_decode import read_arrays
from .zarr_encode import encode_batch
from .zip_container import ZipFormatError, build_archive, crc32, plan_archive
from .zip_decode import read_zip_arrays

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "TrajectoryStore", "normalize_url", "open_store"]

FORMAT_NAME = "daskrl.trajectories"
FORMAT_VERSION = "2.0"
READ_MAJORS = (1, 2)
"""Major format versions this daskrl reads; it writes only :data:`FORMAT_VERSION`'s."""
BATCH_IDS_PER_RUN = 1_000_000_000
"""Run ``r`` numbers its batches from ``r * BATCH_IDS_PER_RUN``."""

# storage_options by store URL, so handles (which carry no credentials) can load in this process.
_OPTIONS: dict[str, dict[str, Any]] = {}


def normalize_url(url: str | os.PathLike[str]) -> str:
    """``file://`` URL of an absolute path for local paths; other URLs unchanged."""
    url = os.fspath(url)
    if not isinstance(url, str) or not url:
        raise StoreError(f"store must be a local path or an fsspec URL, got {url!r}.")
    if "://" not in url:
        return "file://" + str(Path(url).expanduser().absolute())
    if url.startswith("file://"):
        return "file://" + str(Path(url[len("file://") :]).expanduser().absolute())
    return url.rstrip("/")


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
    ) -> None:
        self.url = normalize_url(url)
        self.storage_options = dict(storage_options or {})
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
        most :data:`~daskrl.local_io.MAX_DOCUMENT_BYTES` (:class:`StoreFormatError`
        otherwise, naming the document, ``what`` it is, and the store)."""
        where = f"{what}{key!r} of store {self.url!r}"
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
        return None if raw is None else parse_document(raw, where)

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
    def initialize(self) -> None:
        """Create the root and its sub-groups if missing; check the format otherwise."""
        root = self._get_json("zarr.json")
        if root is None:
            meta = {"daskrl": {"format": FORMAT_NAME, "format_version": FORMAT_VERSION}}
            try:
                self._create_exclusive("zarr.json", _group_doc(meta))
                for sub in ("runs", "batches", "commits"):
                    self._create_exclusive(f"{sub}/zarr.json", _group_doc({}))
            except OSError as e:
                raise StoreError(f"cannot create a store at {self.url!r}: {e}") from e
        self.check_format()
        self._check_write_format()

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
        if major not in {str(m) for m in READ_MAJORS}:
            raise StoreFormatError(
                f"store {self.url!r} has format version {info.get('format_version')!r}; this "
                f"daskrl reads versions {' and '.join(f'{m}.x' for m in READ_MAJORS)}. "
                "Upgrade daskrl."
            )
        self._format_major = int(major)

    def register_run(self, settings: Mapping[str, Any]) -> int:
        """Claim the next free run number (exclusive create) and record ``settings``."""
        existing = sorted(int(k) for k in self._list_groups("runs") if k.isdigit())
        run = existing[-1] + 1 if existing else 0
        while True:
            if run * BATCH_IDS_PER_RUN >= 2**39:
                raise StoreError(f"store {self.url!r} holds too many runs; use a new store.")
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

    # -- reachability probes: does every worker see this very store? ---------------------------
    def write_probe(self, run: int, name: str, token: str) -> None:
        """Leave a small marker under ``runs/<run>/probes/`` (raises :class:`StoreError`)."""
        try:
            sync(self._zstore.set(f"runs/{run:04d}/probes/zarr.json", _json_bytes(_group_doc({}))))
            sync(self._zstore.set(_probe_key(run, name),
                                  _json_bytes(_group_doc({"name": name, "token": token}))))
        except OSError as e:
            raise StoreError(
                f"{name} cannot write to the store {self.url!r} ({type(e).__name__}: {e}). "
                "Check that the path is writable there and its filesystem not full or "
                "read-only."
            ) from e

    def read_probe(self, run: int, name: str) -> str | None:
        """The token of ``name``'s marker, or None if this process cannot see it."""
        doc = self._get_json(_probe_key(run, name))
        return None if doc is None else doc["attributes"].get("token")

    def clear_probes(self, run: int) -> None:
        """Remove the run's markers."""
        self._delete_prefix(f"runs/{run:04d}/probes")

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
        path = f"batches/{batch_id:012d}-{uuid.uuid4().hex[:12]}.zip"
        meta = {**meta, "batch_id": batch_id, "path": path}
        entries = encode_batch(meta, arrays, Compression(compression))
        try:
            if isinstance(self._zstore, LocalStore):
                # In place (the attempt is invisible until committed); see daskrl.local_io.
                self._write_local(os.path.join(self._zstore.root, path), entries)
            else:
                data = b"".join(build_archive(entries).parts)
                sync(self._zstore.set(path, default_buffer_prototype().buffer.from_bytes(data)))
        except ZipFormatError as e:
            raise StoreError(f"cannot write batch {batch_id} to {self.url!r}: {e}.") from e
        except OSError as e:
            raise StoreError(f"cannot write batch {batch_id} to {self.url!r}: {e}") from e
        record = _group_doc(meta)
        committed = self._create_exclusive(f"commits/{batch_id:012d}/zarr.json", record)
        if not committed:
            self._delete_attempt(path)
        return path, committed

    @staticmethod
    def _write_local(file: str, entries: list[tuple[str, list[Any]]]) -> None:
        """A container into a new local file: small ones with one ``pwritev``; large ones with
        their members' data written by the thread pool while their CRC-32s are computed, then
        the headers and the directory (which need the CRCs)."""
        total = sum(memoryview(p).nbytes for _, parts in entries for p in parts)
        if total < _PARALLEL_WRITE_BYTES:
            local_io.write_new_file(file, build_archive(entries).parts)
            return
        pool = local_io.thread_pool()
        plan = plan_archive(entries)
        crcs = [pool.submit(crc32, parts) for _, parts in entries]

        def headers() -> list[tuple[int, list[Any]]]:
            done = [f.result() for f in crcs]
            heads = [(m.offset, [plan.local_header(m, c)]) for m, c in zip(plan.members, done)]
            return [*heads, (plan.directory_offset, [plan.trailer(done)])]

        data = [(m.data_offset, parts) for m, (_, parts) in zip(plan.members, entries) if parts]
        local_io.write_new_file_at(file, data, pool, headers)

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
        """Load the batch at ``path`` (as named by a commit record): a zip container
        (``.zip``, format 2.x) or a group directory (format 1.x).

        The container (:mod:`daskrl.zip_decode`) and every array's metadata (the allowlist of
        :mod:`daskrl.zarr_decode`) are checked before any data is read; each array is decoded
        straight into one tensor (pinned when ``device`` is CUDA) and moved to ``device`` with
        one copy.  ``path`` must be an attempt ``batches/<id:012d>-<attempt>[.zip]`` (of
        ``batch_id`` when given); anything else is refused (:class:`StoreFormatError`).
        """
        check_attempt_path(path, batch_id, f"batch path {path!r} of store {self.url!r}")
        batch_id = _batch_id_of(path)
        where = f"batch {batch_id} ({path!r})" if batch_id is not None else f"batch {path!r}"
        try:
            if path.endswith(".zip"):
                out = read_zip_arrays(self._zstore, path, where, keys, device, self.url,
                                      self._dirs_ok)
            else:
                out = read_arrays(self._zstore, path, where, keys, device, self.url)
        except BatchNotFoundError:
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


_PARALLEL_WRITE_BYTES = 4 << 20
"""Local batches at least this large are written by the thread pool while their CRC-32s are
computed (zlib releases the GIL)."""

_EXCLUSIVE_PROTOCOLS = frozenset({"s3", "s3a", "memory"})
"""fsspec protocols whose ``pipe_file(mode="create")`` is known to be an exclusive create
(s3fs sends ``If-None-Match: *``); others may ignore the mode and overwrite."""


def _probe_key(run: int, name: str) -> str:
    """Key of ``name``'s reachability marker (a worker address made path-safe)."""
    slug = "".join(c if c.isalnum() else "-" for c in name)
    return f"runs/{run:04d}/probes/{slug}/zarr.json"


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
) -> TrajectoryStore:
    """Open an existing daskrl store; no cluster needed.

    ``writable=True`` allows housekeeping (``delete_batches``, ``keep_last``,
    ``collect_garbage``); reading never needs it.
    """
    store = TrajectoryStore(url, storage_options, read_only=not writable)
    store.check_format()
    return store


def options_for(url: str) -> dict[str, Any]:
    """storage_options registered in this process for ``url`` (never stored in handles)."""
    return _OPTIONS.get(url, {})
