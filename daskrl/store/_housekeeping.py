"""Housekeeping of a store: delete batches, keep the last N, collect the debris of crashes.

Every operation is safe while workers write and learners read:

* **Deleting a batch** removes its commit record first, then its zip container.  A batch disappears from listings at once; a reader
  already loading it gets :class:`~daskrl.BatchNotFoundError` (``load`` re-checks the commit
  record after reading), never a half-deleted batch.
* **Garbage** is what no commit record reaches: containers of crashed or losing writers, and ``*.partial`` temporary files.
  :meth:`Housekeeping.collect_garbage` deletes only garbage older than a grace period, so a
  writer still writing (its files are fresh) is never disturbed; committed batches are never
  touched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterable

from daskrl.errors import ConfigError, StoreFormatError
from daskrl.store._commits import CommitIndex
from daskrl.store._documents import Documents
from daskrl.store._layout import (
    ASIDE,
    ATTEMPT_NAME,
    BATCHES,
    COMMITS,
    GROUP_DOC,
    OWN_PARTIAL,
    SUBGROUPS,
    commit_dir,
    commit_key,
    commit_key_of_attempt,
)

__all__ = ["DEFAULT_GRACE_SECONDS", "GarbageReport", "Housekeeping"]

logger = logging.getLogger(__name__)

DEFAULT_GRACE_SECONDS = 3600.0
"""Garbage younger than this is left alone: its writer may still be running."""


@dataclasses.dataclass(frozen=True)
class GarbageReport:
    """What :meth:`~daskrl.TrajectoryStore.collect_garbage` removed (or would remove)."""

    attempts: tuple[str, ...]
    """Uncommitted attempts removed (``batches/<id>-<attempt>.zip``)."""
    partial_files: tuple[str, ...]
    """``*.partial`` temporary files removed."""
    bytes: int
    """Bytes those held."""
    kept: tuple[str, ...]
    """Garbage younger than the grace period, left for a later pass."""
    dry_run: bool = False


class Housekeeping:
    """Deletion and garbage collection of one store."""

    def __init__(self, docs: Documents, index: CommitIndex) -> None:
        self.docs = docs
        self.index = index
        self.backend = docs.backend
        self.url = docs.url

    def attempt_sizes(self) -> dict[str, tuple[int, float]]:
        """``{path: (bytes, mtime)}`` of every file directly under ``batches/`` but its group
        document (zip containers, and anything else put there), from one listing."""
        out: dict[str, tuple[int, float]] = {}
        for key, size, mtime in self.backend.files(BATCHES):
            parts = key.split("/")
            if len(parts) == 2 and parts[1] != GROUP_DOC:
                out[key] = (size, mtime)
        return out

    # -- deletion -------------------------------------------------------------------------------
    def delete_batches(self, batch_ids: Iterable[int]) -> list[int]:
        self.docs.check_writable("delete batches")
        deleted = []
        for bid in batch_ids:
            if isinstance(bid, bool) or not isinstance(bid, int):
                raise ConfigError(f"batch ids must be integers, got {bid!r}.")
            try:
                rec = self.docs.get(commit_key(bid))
            except StoreFormatError as e:  # a damaged record is deleted like any other; its
                logger.warning("deleting the damaged commit record of batch %d: %s", bid, e)
                rec = {}  # container, named by no record now, is garbage (collect_garbage)
            self.index.commits.pop(bid, None)
            self.index.identities.pop(bid, None)
            if rec is None:
                continue
            self.backend.delete(commit_key(bid))  # the batch is gone from here on
            self.backend.delete_prefix(commit_dir(bid))
            path = (rec.get("attributes") or {}).get("path")
            if isinstance(path, str) and _is_attempt(path):
                self.backend.delete(path)
            deleted.append(bid)
            logger.info("deleted batch %d of %s", bid, self.url)
        return deleted

    def keep_last(self, n: int) -> list[int]:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f"keep_last takes an integer >= 0, got {n!r}.")
        self.docs.check_writable("delete batches")
        ids = sorted(self.index.records())
        return self.delete_batches(ids[: max(0, len(ids) - n)])

    # -- garbage --------------------------------------------------------------------------------
    def _moved_aside(self) -> list[str]:
        """Containers a collector renamed aside and did not get to delete (it was killed)."""
        return sorted(f"{BATCHES}/{n[:-len(ASIDE)]}" for n in self.backend.list_dir(BATCHES)
                      if n.endswith(ASIDE) and ATTEMPT_NAME.fullmatch(n[:-len(ASIDE)]))

    def _collect_attempt(self, path: str, moved: bool = False) -> bool:
        """Delete the uncommitted attempt ``path`` unless a writer commits it meanwhile; True
        if deleted.

        A writer stalled (stopped, suspended) past the grace period may resume and commit at
        any moment; it checks its container exists after its commit and writes the batch again
        if not. Where renames are atomic (POSIX) the container is first renamed aside, then the
        commit record is checked: a record made before the check is seen (the container is put
        back), one made after it finds the container gone. Elsewhere the record is checked
        before and after the delete, and a record that names the deleted container (made in
        between) is removed: the batch is lost then, never visible and unreadable.
        """
        if self.backend.renames_atomically:
            aside = path + ASIDE
            if not moved:
                try:
                    self.backend.rename(path, aside)
                except FileNotFoundError:  # deleted by another collector, or committed-deleted
                    return False
            if self.index.names(path):  # committed meanwhile: it is the batch
                with contextlib.suppress(FileNotFoundError):  # put back by another collector
                    self.backend.rename(aside, path)
                return False
            self.backend.delete(aside)
            return True
        if self.index.names(path):
            return False
        self.backend.delete(path)
        if self.index.names(path):
            logger.error("batch %s of %s was committed while its container %r was being "
                         "collected as garbage; the batch is lost and its commit record removed "
                         "(the writer stalled longer than the grace period)",
                         path.split("/")[1][:12], self.url, path)
            self.backend.delete(commit_key_of_attempt(path))
        return True

    def collect_garbage(self, older_than: float, dry_run: bool) -> GarbageReport:
        if isinstance(older_than, bool) or not isinstance(older_than, (int, float)) or older_than < 0:
            raise ConfigError(f"older_than must be a number of seconds >= 0, got {older_than!r}.")
        if not dry_run:
            self.docs.check_writable("collect garbage")
        now = time.time()
        committed = {rec.get("path") for rec in self.index.records().values()}
        removed: list[str] = []
        kept: list[str] = []
        freed = 0
        # 1. containers no commit record names
        for path, (size, newest) in sorted(self.attempt_sizes().items()):
            if path in committed or not _is_attempt(path):
                continue
            if now - newest < older_than:
                kept.append(path)
                continue
            if dry_run:
                if not self.index.names(path):
                    removed.append(path)
                    freed += size
            elif self._collect_attempt(path):
                removed.append(path)
                freed += size
        # 1b. containers a collector moved aside and did not get to delete (it was killed)
        if not dry_run:
            for path in self._moved_aside():
                self._collect_attempt(path, moved=True)
        # 2. temporary files of interrupted writes (only where writes leave such files)
        partials: list[str] = []
        if self.backend.leaves_partial_files:
            for key, size, mtime in self._own_files():
                if not OWN_PARTIAL.fullmatch(key):
                    continue
                if now - mtime < older_than:
                    kept.append(key)
                    continue
                partials.append(key)
                freed += size
                if not dry_run:
                    self.backend.delete(key)
            if not dry_run:
                self.backend.remove_empty_dirs(COMMITS, older_than)
        report = GarbageReport(tuple(removed), tuple(partials), freed, tuple(kept), dry_run)
        logger.info("garbage collection of %s: %s", self.url, report)
        return report

    def _own_files(self) -> list[tuple[str, int, float]]:
        """Files of daskrl's own paths only: the ``runs``, ``batches`` and ``commits`` trees
        and the root's own temporary files (never other things beside them)."""
        out = []
        for sub in SUBGROUPS:
            out += self.backend.files(sub)
        out += [f for f in self.backend.root_files() if OWN_PARTIAL.fullmatch(f[0])]
        return out


def _is_attempt(path: str) -> bool:
    """Whether ``path`` is ``batches/<id:012d>-<attempt>.zip``."""
    parts = path.split("/")
    return len(parts) == 2 and parts[0] == BATCHES and ATTEMPT_NAME.fullmatch(parts[1]) is not None
