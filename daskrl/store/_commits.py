"""What is committed: the commit records (which attempt is *the* batch) and the run records of
a store, listed and checked; a batch is seen whole or not at all."""

from __future__ import annotations

import warnings
from collections.abc import Hashable
from typing import Any

from daskrl.errors import (
    BatchDataMissingError,
    BatchNotFoundError,
    StoreFormatError,
    StoreRecordWarning,
)
from daskrl.store._documents import Documents
from daskrl.store._layout import (
    COMMITS,
    RUNS,
    commit_key,
    commit_key_of_attempt,
    is_commit_name,
    run_key,
)
from daskrl.store._records import check_commit_record, check_run_record

__all__ = ["CommitIndex"]


class CommitIndex:
    """The committed batches of one store, cached and refreshed from its commit records."""

    def __init__(self, docs: Documents) -> None:
        self.docs = docs
        self.url = docs.url
        self.commits: dict[int, dict[str, Any]] = {}
        self.identities: dict[int, Hashable] = {}
        """The identity of each record in ``commits`` as it was read (local stores)."""
        self.skipped: dict[int, str] = {}
        """Commit records that cannot be read, by batch id: why."""
        self.skipped_runs: dict[int, str] = {}

    def refresh(self) -> None:
        """Pick up batches committed, and drop batches deleted, since the last look."""
        backend = self.docs.backend
        backend.invalidate(COMMITS)
        listed = {int(k) for k in self.docs.list_groups(COMMITS) if is_commit_name(k)}
        if backend.lists_empty_dirs:
            # A directory outlives its record for a moment while a batch is deleted.
            listed = {b for b in listed if backend.entry_exists(commit_key(b))}
        for bid in set(self.commits) - listed:
            del self.commits[bid]
            self.identities.pop(bid, None)
        for bid in set(self.skipped) - listed:
            del self.skipped[bid]
        fresh = []
        for bid in sorted(listed - set(self.commits)):  # new records, and bad ones again
            key = commit_key(bid)
            try:
                doc, ident = self.docs.get_identified(key, "commit record ")
                if doc is not None:
                    self.commits[bid] = check_commit_record(
                        doc, bid, f"commit record {key!r} of store {self.url!r}")
                    if ident is not None:
                        self.identities[bid] = ident
                self.skipped.pop(bid, None)  # repaired, or gone
            except StoreFormatError as e:  # one bad record must not hide the good ones
                if bid not in self.skipped:
                    fresh.append(bid)  # reported once
                self.skipped[bid] = str(e)
        if fresh:
            warnings.warn(StoreRecordWarning(
                f"store {self.url!r}: skipped {len(fresh)} unreadable commit record(s) of "
                f"batches {fresh[:10]}{' ...' if len(fresh) > 10 else ''}: "
                f"{self.skipped[fresh[0]]} (all: store.skipped_records())"), stacklevel=3)

    def records(self) -> dict[int, dict[str, Any]]:
        """Commit records by batch id, ascending (fresh)."""
        self.refresh()
        return {bid: dict(self.commits[bid]) for bid in sorted(self.commits)}

    def record(self, batch_id: int) -> dict[str, Any]:
        """The commit record of ``batch_id`` (refreshed if not known yet)."""
        if batch_id not in self.commits:
            self.refresh()
        if batch_id in self.skipped:
            raise StoreFormatError(self.skipped[batch_id])
        if batch_id not in self.commits:
            raise BatchNotFoundError(
                f"no committed batch {batch_id} in store {self.url!r} "
                f"({len(self.commits)} batches; ids via store.batch_ids())."
            )
        return self.commits[batch_id]

    def runs(self) -> dict[int, dict[str, Any]]:
        """Run records by run number; unreadable ones skipped with a warning."""
        out = {}
        bad = []
        for name in self.docs.list_groups(RUNS):
            if name.isdigit():
                key = run_key(int(name))
                try:
                    doc = self.docs.get(key, "run record ")
                    if doc is not None:
                        out[int(name)] = check_run_record(
                            doc, int(name), f"run record {key!r} of store {self.url!r}")
                        self.skipped_runs.pop(int(name), None)
                except StoreFormatError as e:
                    if int(name) not in self.skipped_runs:
                        bad.append(int(name))
                    self.skipped_runs[int(name)] = str(e)
        if bad:
            warnings.warn(StoreRecordWarning(
                f"store {self.url!r}: skipped {len(bad)} unreadable run record(s) {bad[:10]}: "
                f"{self.skipped_runs[bad[0]]} (all: store.skipped_records())"), stacklevel=3)
        return out

    def skipped_records(self) -> dict[str, str]:
        """Unreadable commit and run records by key: what is wrong with each."""
        self.refresh()
        self.runs()
        out = {commit_key(bid): why for bid, why in self.skipped.items()}
        out.update({run_key(run): why for run, why in self.skipped_runs.items()})
        return dict(sorted(out.items()))

    def check_still_committed(self, batch_id: int | None, path: str) -> None:
        """Raise :class:`BatchNotFoundError` unless the commit record of ``batch_id`` names
        ``path`` now: re-read, or, for a record read by the listing, found to be the same file,
        unchanged (its identity: inode, size, times)."""
        if batch_id is None:
            return
        key = commit_key(batch_id)
        known = self.identities.get(batch_id)
        if known is not None and self.commits.get(batch_id, {}).get("path") == path and \
                self.docs.identity(key) == known:
            return  # the record read at the listing, unchanged since (one lstat, no read)
        rec = self.docs.get(key)
        attrs = rec.get("attributes") if rec is not None else None
        if not isinstance(attrs, dict) or attrs.get("path") != path:
            self.commits.pop(batch_id, None)
            self.identities.pop(batch_id, None)
            raise BatchNotFoundError(
                f"batch {batch_id} of {self.url!r} was deleted while it was being read "
                f"({path!r} is no longer committed)."
            )

    def still_committed(self, batch_id: int, path: str) -> bool:
        """The commit record of ``batch_id`` still names ``path`` (re-read now)."""
        try:
            self.check_still_committed(batch_id, path)
        except BatchNotFoundError:
            return False
        return True

    def data_missing(self, batch_id: int, path: str) -> BatchDataMissingError:
        return BatchDataMissingError(
            f"batch {batch_id} ({path!r}) of {self.url!r} is committed but its data is "
            "missing: the store is damaged (the container was deleted or moved by something "
            "other than daskrl). Restore it from a copy, or delete the batch: "
            f"open_store(url, writable=True).delete_batches([{batch_id}])."
        )

    def names(self, path: str) -> bool:
        """Whether the commit record of attempt ``path``'s batch names ``path`` now (a damaged
        record may: True)."""
        try:
            rec = self.docs.get(commit_key_of_attempt(path))
        except StoreFormatError:
            return True
        return rec is not None and (rec.get("attributes") or {}).get("path") == path
