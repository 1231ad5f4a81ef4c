"""Housekeeping of a store: delete batches, keep the last N, collect the debris of crashes.

Mixed into :class:`~daskrl.TrajectoryStore`.  Every operation is safe while workers write and
learners read:

* **Deleting a batch** removes its commit record first, then its data (one zip container in
  format 2.x, a directory tree in 1.x).  A batch disappears
  from listings at once; a reader already loading it gets :class:`~daskrl.BatchNotFoundError`
  (``load`` re-checks the commit record after reading), never a half-deleted batch.
* **Garbage** is what no commit record reaches: attempts (containers or 1.x directories) of
  crashed or losing writers, and ``*.partial`` temporary files.  :meth:`StoreHousekeeping.collect_garbage` deletes only
  garbage older than a grace period, so a writer still writing (its files are fresh) is never
  disturbed; committed batches are never touched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from zarr.core.sync import sync
from zarr.storage import FsspecStore, LocalStore

from daskrl.errors import ConfigError, StoreError, StoreFormatError

__all__ = ["ATTEMPT_NAME", "DEFAULT_GRACE_SECONDS", "GarbageReport", "StoreHousekeeping"]

logger = logging.getLogger(__name__)

ATTEMPT_NAME = re.compile(r"\d{12}-[0-9A-Za-z]+(?:\.zip)?")
"""Name of an attempt under ``batches/``: ``<id:012d>-<attempt>.zip`` (2.x) or a 1.x
directory ``<id:012d>-<attempt>``."""

_OWN_PARTIAL = re.compile(r"(?:(?:runs|batches|commits)/(?:[^/]+/)*)?[^/]+\.[0-9a-f]{32}\.partial")
"""Temporary files daskrl (and zarr's ``LocalStore``) leave when a local write is cut:
``<name>.<32 hex>.partial``, at the root or under ``runs/``, ``batches/``, ``commits/``."""

_ASIDE = ".gc"
"""Suffix of a container a collector renamed aside before deleting it (local stores)."""

DEFAULT_GRACE_SECONDS = 3600.0
"""Garbage younger than this is left alone: its writer may still be running."""


@dataclasses.dataclass(frozen=True)
class GarbageReport:
    """What :meth:`StoreHousekeeping.collect_garbage` removed (or would remove)."""

    attempts: tuple[str, ...]
    """Uncommitted attempts removed (``batches/<id>-<attempt>.zip``, or a 1.x directory
    ``batches/<id>-<attempt>``)."""
    partial_files: tuple[str, ...]
    """``*.partial`` temporary files removed."""
    bytes: int
    """Bytes those held."""
    kept: tuple[str, ...]
    """Garbage younger than the grace period, left for a later pass."""
    dry_run: bool = False


def _mtime(info: dict[str, Any]) -> float:
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


class StoreHousekeeping:
    """Deletion and garbage collection; mixed into :class:`~daskrl.TrajectoryStore`."""

    url: str
    read_only: bool
    _zstore: Any
    _commits: dict[int, dict[str, Any]]

    # provided by TrajectoryStore
    def refresh(self) -> None: ...
    def _get_json(self, key: str, what: str = "") -> dict[str, Any] | None: ...
    def _list_groups(self, prefix: str) -> list[str]: ...

    def _check_writable(self, what: str) -> None:
        if self.read_only:
            raise StoreError(
                f"cannot {what}: store {self.url!r} was opened read-only. Open it with "
                "daskrl.open_store(url, writable=True)."
            )

    # -- listing with sizes and times -----------------------------------------------------------
    def _files(self, prefix: str, dirs: bool = False) -> list[tuple[str, int, float]]:
        """``(key, size, mtime)`` of every file under ``prefix`` (a key, no trailing slash).

        ``dirs=True`` adds local directories (size 0): a writer creates them before its files.
        """
        if isinstance(self._zstore, LocalStore):
            root = Path(self._zstore.root)
            out = []
            for dirpath, _, files in os.walk(root / prefix):
                if dirs:
                    try:
                        out.append((Path(dirpath).relative_to(root).as_posix(), 0,
                                    os.stat(dirpath).st_mtime))
                    except FileNotFoundError:
                        pass
                for name in files:
                    p = Path(dirpath) / name
                    try:
                        st = p.stat()
                    except FileNotFoundError:  # removed meanwhile (a temp file renamed)
                        continue
                    out.append((p.relative_to(root).as_posix(), st.st_size, st.st_mtime))
            return out
        if isinstance(self._zstore, FsspecStore):
            fs, base = self._zstore.fs, self._zstore.path
            fs.invalidate_cache(f"{base}/{prefix}")
            try:
                found = sync(fs._find(f"{base}/{prefix}", detail=True, withdirs=False))
            except FileNotFoundError:
                return []
            return [(k[len(base) + 1:] if base else k, int(v.get("size") or 0), _mtime(v))
                    for k, v in found.items() if v.get("type", "file") != "directory"]
        raise StoreError(f"store {self.url!r}: unsupported zarr store {type(self._zstore)!r}")

    def _own_files(self) -> list[tuple[str, int, float]]:
        """:meth:`_files` of daskrl's own paths only: the root's own documents and the
        ``runs``, ``batches`` and ``commits`` trees (never other things beside them)."""
        root = Path(self._zstore.root)
        out = []
        for sub in ("runs", "batches", "commits"):
            out += self._files(sub)
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(root):
                if entry.is_file(follow_symlinks=False) and _OWN_PARTIAL.fullmatch(entry.name):
                    st = entry.stat(follow_symlinks=False)
                    out.append((entry.name, st.st_size, st.st_mtime))
        return out

    def _rmdir_empty(self, prefix: str, older_than: float) -> None:
        """Remove empty directories under ``prefix`` on a local store (bottom-up) that are
        older than ``older_than`` seconds (a writer may be about to write into a new one)."""
        if not isinstance(self._zstore, LocalStore):
            return
        top = Path(self._zstore.root) / prefix
        now = time.time()
        for dirpath, _, _ in sorted(os.walk(top), key=lambda w: -len(w[0])):
            if Path(dirpath) != top:
                try:
                    if now - os.stat(dirpath).st_mtime >= older_than:
                        os.rmdir(dirpath)
                except OSError:  # not empty, or gone
                    pass

    def _delete_key(self, key: str) -> None:
        sync(self._zstore.delete(key))

    def attempt_sizes(self) -> dict[str, tuple[int, float]]:
        """``{attempt path: (bytes, newest mtime)}`` of everything under ``batches/``: zip
        containers and 1.x attempt directories (``batches/<name>``), from one listing."""
        out: dict[str, tuple[int, float]] = {}
        for key, size, mtime in self._files("batches", dirs=True):
            parts = key.split("/")
            if len(parts) < 2 or key == "batches/zarr.json" or parts[1] == "zarr.json":
                continue
            attempt = "/".join(parts[:2])
            total, newest = out.get(attempt, (0, 0.0))
            out[attempt] = (total + size, max(newest, mtime))
        return out

    def _delete_attempt_data(self, path: str) -> None:
        if path.endswith(".zip"):
            try:
                self._delete_key(path)
            except FileNotFoundError:
                pass
        else:
            self._delete_dir(path)

    def _delete_dir(self, prefix: str) -> None:
        if isinstance(self._zstore, LocalStore):
            import shutil

            shutil.rmtree(Path(self._zstore.root) / prefix, ignore_errors=True)
        else:
            sync(self._zstore.delete_dir(prefix))

    # -- deletion -------------------------------------------------------------------------------
    def delete_batches(self, batch_ids: Iterable[int]) -> list[int]:
        """Delete committed batches: each commit record first, then the batch's data.

        Ids that are not committed are skipped.  Returns the ids deleted.  A task still
        retrying a deleted id could commit it again; delete only batches whose tasks are done.
        """
        self._check_writable("delete batches")
        deleted = []
        for bid in batch_ids:
            if isinstance(bid, bool) or not isinstance(bid, int):
                raise ConfigError(f"batch ids must be integers, got {bid!r}.")
            key = f"commits/{bid:012d}"
            try:
                rec = self._get_json(f"{key}/zarr.json")
            except StoreFormatError as e:  # a damaged record is deleted like any other; its
                logger.warning("deleting the damaged commit record of batch %d: %s", bid, e)
                rec = {}  # container, named by no record now, is garbage (collect_garbage)
            self._commits.pop(bid, None)
            if rec is None:
                continue
            self._delete_key(f"{key}/zarr.json")  # the batch is gone from here on
            self._delete_dir(key)
            path = (rec.get("attributes") or {}).get("path")
            if isinstance(path, str) and path.startswith("batches/") and path.count("/") == 1:
                self._delete_attempt_data(path)
            deleted.append(bid)
            logger.info("deleted batch %d of %s", bid, self.url)
        return deleted

    def keep_last(self, n: int) -> list[int]:
        """Delete all but the ``n`` committed batches with the highest ids; return those deleted.

        Batch ids grow with runs and, within a run, in submission order, so this keeps the
        newest batches (a replay buffer's window).
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f"keep_last takes an integer >= 0, got {n!r}.")
        self._check_writable("delete batches")
        self.refresh()
        ids = sorted(self._commits)
        return self.delete_batches(ids[: max(0, len(ids) - n)])

    # -- garbage --------------------------------------------------------------------------------
    def _names(self, path: str) -> bool:
        """Whether the commit record of ``path``'s batch names ``path`` now."""
        try:
            rec = self._get_json(f"commits/{path.split('/')[1][:12]}/zarr.json")
        except StoreFormatError:  # a damaged record may name it: never collect its container
            return True
        return rec is not None and (rec.get("attributes") or {}).get("path") == path

    def _moved_aside(self) -> list[str]:
        if not isinstance(self._zstore, LocalStore):
            return []
        try:
            names = os.listdir(Path(self._zstore.root) / "batches")
        except FileNotFoundError:
            return []
        return sorted(f"batches/{n[:-len(_ASIDE)]}" for n in names
                      if n.endswith(_ASIDE) and ATTEMPT_NAME.fullmatch(n[:-len(_ASIDE)]))

    def _collect_attempt(self, path: str, moved: bool = False) -> bool:
        """Delete the uncommitted attempt ``path`` unless a writer commits it meanwhile; True
        if deleted.

        A writer stalled (stopped, suspended) past the grace period may resume and commit at
        any moment; it checks its container exists after its commit and writes the batch again
        if not. On a local filesystem the container is first renamed aside (atomic), then the
        commit record is checked: a record made before the check is seen (the container is put
        back), one made after it finds the container gone. Elsewhere the record is checked
        before and after the delete, and a record that names the deleted container (made in
        between) is removed: the batch is lost then, never visible and unreadable.
        """
        if isinstance(self._zstore, LocalStore) and path.endswith(".zip"):
            src = Path(self._zstore.root) / path
            aside = src.with_name(src.name + _ASIDE)
            if not moved:
                try:
                    os.rename(src, aside)
                except FileNotFoundError:  # deleted by another collector, or committed-deleted
                    return False
            if self._names(path):  # committed meanwhile: it is the batch
                with contextlib.suppress(FileNotFoundError):  # put back by another collector
                    os.rename(aside, src)
                return False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(aside)
            return True
        if self._names(path):
            return False
        self._delete_attempt_data(path)
        if self._names(path):
            key = f"commits/{path.split('/')[1][:12]}/zarr.json"
            logger.error("batch %s of %s was committed while its container %r was being "
                         "collected as garbage; the batch is lost and its commit record removed "
                         "(the writer stalled longer than the grace period)",
                         path.split("/")[1][:12], self.url, path)
            with contextlib.suppress(FileNotFoundError):
                self._delete_key(key)
        return True

    def collect_garbage(
        self, older_than: float = DEFAULT_GRACE_SECONDS, *, dry_run: bool = False
    ) -> GarbageReport:
        """Delete uncommitted attempts and ``*.partial`` files older than ``older_than`` seconds.

        Committed batches and their commit records are never touched.  Garbage younger than
        the grace period is kept (a writer may still be writing it; daskrl writes a whole
        batch in one burst and commits right after, so an hour is generous).

        Parameters
        ----------
        older_than
            Grace period in seconds (``0`` removes all garbage: only when no writer runs).
        dry_run
            Report what would be removed without removing it.
        """
        if isinstance(older_than, bool) or not isinstance(older_than, (int, float)) or older_than < 0:
            raise ConfigError(f"older_than must be a number of seconds >= 0, got {older_than!r}.")
        if not dry_run:
            self._check_writable("collect garbage")
        now = time.time()
        self.refresh()
        committed = {rec.get("path") for rec in self._commits.values()}
        removed: list[str] = []
        kept: list[str] = []
        freed = 0
        # 1. attempts (containers, 1.x directories) no commit record names
        for path, (size, newest) in sorted(self.attempt_sizes().items()):
            name = path.split("/", 1)[1]
            if path in committed or not ATTEMPT_NAME.fullmatch(name):
                continue
            if now - newest < older_than:
                kept.append(path)
                continue
            if dry_run:
                if not self._names(path):
                    removed.append(path)
                    freed += size
            elif self._collect_attempt(path):
                removed.append(path)
                freed += size
        # 1b. containers a collector moved aside and did not get to delete (it was killed)
        for path in self._moved_aside():
            if not dry_run:
                self._collect_attempt(path, moved=True)
        # 2. temporary files of interrupted local writes (fsspec stores write no such files)
        partials: list[str] = []
        if isinstance(self._zstore, LocalStore):
            for key, size, mtime in self._own_files():
                if not _OWN_PARTIAL.fullmatch(key) or any(key.startswith(p + "/")
                                                          for p in removed):
                    continue
                if now - mtime < older_than:
                    kept.append(key)
                    continue
                partials.append(key)
                freed += size
                if not dry_run:
                    try:
                        os.unlink(Path(self._zstore.root) / key)
                    except FileNotFoundError:
                        pass
            if not dry_run:
                self._rmdir_empty("commits", older_than)
        report = GarbageReport(tuple(removed), tuple(partials), freed, tuple(kept), dry_run)
        logger.info("garbage collection of %s: %s", self.url, report)
        return report
