"""What workers and collectors write: runs, reachability probes, and batches (one container
under a fresh attempt name, then an exclusive commit record)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np

from daskrl.errors import StoreError
from daskrl.store._documents import Documents
from daskrl.store._format import EncodedBatch, ZipFormatError, encode_batch
from daskrl.store._format.codec_choice import CodecChoices
from daskrl.store._format.compression import Compression
from daskrl.store._layout import (
    MAX_RUNS,
    RUNS,
    attempt_path,
    commit_key,
    group_doc,
    probe_dir,
    probe_key,
    run_key,
)

__all__ = ["COMMIT_TRIES", "Writer"]

logger = logging.getLogger(__name__)

COMMIT_TRIES = 3
"""Times a writer writes a batch again after a garbage collector removed its container (or
its commit's temporary file) before the commit, before it gives up."""


class Writer:
    """Writes to one store (its :class:`Documents` say whether it may)."""

    def __init__(self, docs: Documents) -> None:
        self.docs = docs
        self.backend = docs.backend
        self.url = docs.url
        self.codec_choices: CodecChoices | None = CodecChoices()
        """Which arrays this writer compresses (decided per array of each stream); None
        compresses every array with the plain codec of its ``compression`` (what writers of
        daskrl before per-array choices did)."""

    # -- runs ------------------------------------------------------------------------------
    def register_run(self, settings: Mapping[str, Any], resumes: int | None = None) -> int:
        run = self.next_run()
        while True:
            self._check_run_number(run)
            attrs = {"run": run, "settings": dict(settings), "started": time.time(),
                     "nonce": uuid.uuid4().hex}
            if resumes is not None:
                attrs["resumes"] = resumes
            doc = group_doc(attrs)
            try:
                created = self.docs.create_exclusive(run_key(run), doc)
            except StoreError:
                raise
            except OSError as e:
                raise StoreError(
                    f"cannot write to the store {self.url!r} ({type(e).__name__}: {e}). Check "
                    "that the path is writable and its filesystem not full or read-only."
                ) from e
            if created:
                return run
            run += 1

    def next_run(self) -> int:
        existing = sorted(int(k) for k in self.docs.list_groups(RUNS) if k.isdigit())
        run = existing[-1] + 1 if existing else 0
        self._check_run_number(run)
        return run

    def _check_run_number(self, run: int) -> None:
        if run >= MAX_RUNS:
            raise StoreError(
                f"store {self.url!r} has used all {MAX_RUNS:_} run numbers a store can have "
                f"(its newest run is {run - 1}; each run's batch and episode ids must fit "
                "64 bits). Collect into a new "
                "store; this one stays readable."
            )

    # -- probes ----------------------------------------------------------------------------
    def write_probe(self, probe: str, name: str, token: str) -> None:
        try:
            self.docs.put(f"{probe_dir(probe)}/zarr.json", group_doc({}))
            self.docs.put(probe_key(probe, name), group_doc({"name": name, "token": token}))
        except OSError as e:
            raise StoreError(
                f"{name} cannot write to the store {self.url!r} ({type(e).__name__}: {e}). "
                "Check that the path is writable there and its filesystem not full or "
                "read-only."
            ) from e

    def read_probe(self, probe: str, name: str) -> str | None:
        doc = self.docs.get(probe_key(probe, name))
        return None if doc is None else doc["attributes"].get("token")

    def clear_probes(self, probe: str) -> None:
        self._delete_debris(probe_dir(probe), prefix=True)

    # -- batches ---------------------------------------------------------------------------
    def write_batch(self, batch_id: int, arrays: Mapping[str, np.ndarray],
                    meta: Mapping[str, Any], compression: Compression) -> tuple[str, bool]:
        self.docs.check_writable(f"write batch {batch_id}")
        key = commit_key(batch_id)
        for _ in range(COMMIT_TRIES):
            path = attempt_path(batch_id)
            full = {**meta, "batch_id": batch_id, "path": path}
            encoded = encode_batch(full, arrays, Compression(compression),
                                   choices=self.codec_choices, stream=meta.get("stream"))
            self._write_container(batch_id, path, encoded)
            try:
                committed = self.docs.create_exclusive(key, group_doc(full))
            except FileNotFoundError:
                # The commit's temporary file (or its directory) was collected as garbage while
                # this writer was stalled: its container may be gone too. Write it again.
                self._delete_debris(path)
                logger.warning("batch %d: the commit's temporary file of %r was removed by a "
                               "garbage collector; writing the batch again", batch_id, path)
                continue
            except OSError as e:  # e.g. ENOSPC: the container fitted, its commit record did not
                self._delete_debris(path)
                if isinstance(e, StoreError):
                    raise
                raise self.docs.access_error(
                    f"write the commit record of batch {batch_id} (the batch was not committed; "
                    "its container was removed)", e) from e
            if not committed:
                self._delete_debris(path)
                return path, False
            # A writer stalled (stopped, suspended) between its container and its commit for
            # longer than the collector's grace period finds its container collected. The
            # commit must never name a container that is gone: check, undo and write again.
            if self.backend.exists(path):
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

    def _write_container(self, batch_id: int, path: str, batch: EncodedBatch) -> None:
        try:
            self.backend.write_container(path, batch)
        except ZipFormatError as e:
            raise StoreError(f"cannot write batch {batch_id} to {self.url!r}: {e}.") from e
        except OSError as e:
            raise StoreError(f"cannot write batch {batch_id} to {self.url!r}: {e}") from e

    def _undo_commit(self, batch_id: int, key: str, path: str) -> None:
        """Remove this writer's own commit record of ``path`` (its container is gone)."""
        try:
            self.backend.delete(key)
        except OSError as e:
            raise StoreError(
                f"batch {batch_id} of {self.url!r}: its container {path!r} was removed by a "
                f"garbage collector before its commit, and the commit record {key!r} could not "
                f"be removed ({e}). Delete the batch (store.delete_batches([{batch_id}]))."
            ) from e

    def _delete_debris(self, path: str, prefix: bool = False) -> None:
        """Remove an attempt's container (or a prefix); a failure leaves debris only, which a
        garbage collector removes later."""
        try:
            if prefix:
                self.backend.delete_prefix(path)
            else:
                self.backend.delete(path)
        except Exception:
            logger.debug("could not remove %r of %s (left for a garbage collector)", path,
                         self.url, exc_info=True)
