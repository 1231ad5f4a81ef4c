"""The trajectory store: batches as zarr v3 groups under an fsspec URL, made visible by commits.

A worker writes a batch as one file under a fresh attempt name (on local and shared POSIX
filesystems in place, with plain file I/O; elsewhere one put), then creates the commit record
with an atomic, exclusive create.  Readers list commits only, so a batch is seen whole or not
at all, and a retried task's second commit of the same id is detected and dropped.  Names and
paths:
:mod:`daskrl.store._layout`; where the bytes live: :mod:`daskrl.store._backends`.

:class:`TrajectoryStore` is a facade over small parts that share one backend: documents
(:mod:`._documents`), the root and its format (:mod:`._root`), the commit index (:mod:`._commits`), the writer (:mod:`._writing`), the
reader (:mod:`._reading`) and housekeeping (:mod:`._housekeeping`).  What a learner reads
from it (datasets, episodes, the dask and xarray views) is :mod:`daskrl.data`.
Credentials (``storage_options``) live on the store object only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

import numpy as np
import torch

from daskrl._nested import nest
from daskrl.errors import BatchNotFoundError, UsageError
from daskrl.store._backends import Backend, open_backend
from daskrl.store._batch_handle import BatchHandle, register_store_opener
from daskrl.store._commits import CommitIndex
from daskrl.store._documents import Documents
from daskrl.store._env_select import EnvFilter, env_matcher
from daskrl.store._format import ArrayLayout, ReadLimits
from daskrl.store._format.compression import Compression
from daskrl.store._housekeeping import DEFAULT_GRACE_SECONDS, GarbageReport, Housekeeping
from daskrl.store._layout import BATCH_IDS_PER_RUN, FORMAT_NAME, FORMAT_VERSION, MAX_RUNS
from daskrl.store._reading import BatchSizes, Reader
from daskrl.store._root import check_root, create_root
from daskrl.store._url import check_store_options, normalize_url
from daskrl.store._writing import Writer

__all__ = ["BATCH_IDS_PER_RUN", "FORMAT_NAME", "FORMAT_VERSION", "MAX_RUNS", "BatchHandle",
           "TrajectoryStore", "VersionFilter", "check_store_options", "normalize_url",
           "open_store"]

VersionFilter = int | Collection[int] | Callable[[int], bool] | None
"""A weights version, a collection of them (``range`` works), or a predicate."""


def _matches(value: Any, selector: Any) -> bool:
    if selector is None:
        return True
    if callable(selector):
        return bool(selector(value))
    if isinstance(selector, (str, int)):
        return value == selector
    return value in selector


class TrajectoryStore:
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
        self.storage_options = check_store_options(self.url, storage_options)
        self.read_only = read_only
        self.read_limits = read_limits or ReadLimits()
        """Bounds on what a batch may make a reader allocate (see ``docs/reading.md``)."""
        self._backend = open_backend(self.url, self.storage_options, read_only)
        self._docs = Documents(self._backend, self.url, self.storage_options, read_only)
        self._index = CommitIndex(self._docs)
        self._reader = Reader(self._docs, self._index, self.read_limits)
        self._writer = Writer(self._docs)
        self._housekeeping = Housekeeping(self._docs, self._index)
        self._format_checked = False

    def __reduce__(self) -> tuple[Any, ...]:  # reopened where unpickled (dask graphs)
        return (_reopen, (self.url, self.storage_options, self.read_only, self.read_limits))

    def __repr__(self) -> str:
        return f"TrajectoryStore({self.url!r}{', writable' if not self.read_only else ''})"

    @property
    def backend(self) -> Backend:
        """Where the store's bytes live (:class:`~daskrl.store._backends.Backend`)."""
        return self._backend

    # -- format ------------------------------------------------------------------------------
    def initialize(self, *, allow_non_empty: bool = False) -> None:
        """Create the root and its sub-groups if missing; check the format otherwise.

        A new store is not created in a directory (or under a prefix) that holds other things,
        unless ``allow_non_empty``: the store's garbage collector and its listings own its
        ``runs``, ``batches`` and ``commits`` (only those, and the root's ``zarr.json``).
        """
        create_root(self._docs, allow_non_empty)
        self.check_format()

    def check_format(self) -> None:
        """Raise :class:`StoreFormatError` unless this is a daskrl store this version reads
        (and, this version reading only the format it writes, writes)."""
        check_root(self._docs)
        self._format_checked = True

    def _check_write_format(self) -> None:
        if not self._format_checked:
            self.check_format()

    # -- writing (collectors and workers) ------------------------------------------------------
    def register_run(self, settings: Mapping[str, Any], *, resumes: int | None = None) -> int:
        """Claim the next free run number (exclusive create) and record ``settings`` (and
        ``resumes``: the run this one continues, see ``docs/integrations/resume.md``).

        A store numbers at most :data:`MAX_RUNS` runs (runs 0 to 66,085; see
        :func:`~daskrl.store._layout.run_first_batch` and ``docs/store-format.md``).
        """
        return self._writer.register_run(settings, resumes)

    def next_run(self) -> int:
        """The run number :meth:`register_run` would claim now; raises :class:`StoreError` if
        the store has none left (a check before a collector starts its cluster)."""
        return self._writer.next_run()

    def write_probe(self, probe: str, name: str, token: str) -> None:
        """Leave a small marker under ``runs/probe-<probe>/`` (raises :class:`StoreError`).

        Probes run before a collector registers its run, so they are not under a run."""
        self._writer.write_probe(probe, name, token)

    def read_probe(self, probe: str, name: str) -> str | None:
        """The token of ``name``'s marker, or None if this process cannot see it."""
        return self._writer.read_probe(probe, name)

    def clear_probes(self, probe: str) -> None:
        """Remove the probe's markers."""
        self._writer.clear_probes(probe)

    def write_batch(self, batch_id: int, arrays: Mapping[str, np.ndarray],
                    meta: Mapping[str, Any], compression: Compression = Compression.ZSTD,
                    ) -> tuple[str, bool]:
        """Write a batch as one zip container under a fresh attempt name, then commit it.

        Returns ``(path, committed)``: ``committed`` is False when another attempt of the same
        batch id committed first (this attempt's file is then removed).
        """
        self._docs.check_writable(f"write batch {batch_id}")
        self._check_write_format()
        return self._writer.write_batch(batch_id, arrays, meta, compression)

    # -- listing -------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Pick up batches committed, and drop batches deleted, since the last look."""
        self._index.refresh()

    def batch_ids(self) -> list[int]:
        """Committed batch ids, ascending."""
        return list(self._index.records())

    def __len__(self) -> int:
        return len(self.batch_ids())

    def __iter__(self) -> Iterator[BatchHandle]:
        for bid in self.batch_ids():
            yield self.handle(bid)

    @property
    def num_batches(self) -> int:
        """Committed batches (same as ``len(store)``)."""
        return len(self.batch_ids())

    @property
    def frames(self) -> int:
        """Frames in all committed batches."""
        return sum(int(c["frames"]) for c in self._index.records().values())

    def records(self) -> dict[int, dict[str, Any]]:
        """Commit records by batch id (plain JSON metadata, see the store format)."""
        return self._index.records()

    def runs(self) -> dict[int, dict[str, Any]]:
        """Run records by run number: ``{"run", "settings", "started", ...}`` (and
        ``"resumes"``: the run a resumed run continues).

        Records that cannot be read are skipped with a :class:`~daskrl.StoreRecordWarning`
        (listed by :meth:`skipped_records`)."""
        return self._index.runs()

    def skipped_records(self) -> dict[str, str]:
        """Records that listings skip because they cannot be read (garbage, truncated, wrongly
        typed, or naming a path that is not the batch's own), by key (``commits/<id>/zarr.json``,
        ``runs/<run>/zarr.json``): what is wrong with each.  Loading such a batch raises
        :class:`StoreFormatError`."""
        return self._index.skipped_records()

    def weights_versions(self) -> list[int]:
        """Weights versions present among the committed batches, ascending."""
        return sorted({int(r["weights_version"]) for r in self.records().values()})

    def workers(self) -> list[str]:
        """Addresses of the workers that wrote the committed batches."""
        return sorted({str(r["worker"]) for r in self.records().values()})

    def handle(self, batch_id: int) -> BatchHandle:
        """The :class:`BatchHandle` of a committed batch."""
        return self._handle(self._index.record(batch_id))

    def _handle(self, rec: Mapping[str, Any]) -> BatchHandle:
        return BatchHandle.from_record(self.url, rec, needs_options=bool(self.storage_options)
                                       ).with_store(self)

    def handles(
        self, *, weights_version: VersionFilter = None, worker: str | Collection[str] | None = None,
        env: EnvFilter = None,
    ) -> list[BatchHandle]:
        """Handles of the committed batches that match, by ascending batch id.

        ``weights_version``: a version, a collection of versions (e.g. ``range(5, 10)``), or a
        predicate ``f(version) -> bool``; ``worker``: a worker address or a collection of them;
        ``env``: the env the batch came from, by index (``BatchHandle.env``) or by label as its
        run's settings name it (``"CartPole-v1"``), or a collection of those.
        """
        env_ok = env_matcher(env, self.runs)
        return [self._handle(rec) for rec in self.records().values()
                if _matches(int(rec["weights_version"]), weights_version)
                and _matches(str(rec["worker"]), worker)
                and (env_ok is None or env_ok(rec))]

    # -- reading -------------------------------------------------------------------------------
    def load(
        self,
        batch: int | BatchHandle,
        device: torch.device | str | None = None,
        keys: Sequence[str] | None = None,
        *,
        flat: bool = False,
    ) -> dict[str, Any]:
        """Load a batch (its id, or a :class:`BatchHandle` of this store) as ``{key: tensor
        [T, E, ...]}`` on ``device``.

        The arrays of a ``Dict`` or ``Tuple`` space and of ``info`` come as nested mappings:
        ``batch["observation"]["desired_goal"]``, ``batch["observation"][0]`` (a tuple),
        ``batch["info"]["lives"]``.  ``keys`` name arrays or groups of them (``"observation"``,
        ``"observation/desired_goal"``, ``"info"``).  ``flat=True``: every array under its
        name instead, ``{"observation/desired_goal": tensor, ...}``."""
        if isinstance(batch, BatchHandle):
            if normalize_url(batch.store_url) != self.url:
                raise UsageError(f"the handle of batch {batch.batch_id} belongs to the store "
                                 f"{batch.store_url!r}, not to {self.url!r}.")
            out = self._reader.load_path(batch.path, device, keys, batch.batch_id)
        else:
            out = self._reader.load_path(self._index.record(batch)["path"], device, keys, None)
        return out if flat else nest(out)

    def load_path(
        self, path: str, device: torch.device | str | None = None,
        keys: Sequence[str] | None = None, batch_id: int | None = None, *, flat: bool = False,
    ) -> dict[str, Any]:
        """Load the batch at ``path`` (as named by a commit record): its zip container.

        The container and every array's metadata (the allowlist of the store format) are
        checked before any data is read; each array is decoded straight into one tensor
        (pinned when ``device`` is CUDA) and moved to ``device`` with one copy.  ``path`` must
        be an attempt ``batches/<id:012d>-<attempt>.zip`` (of ``batch_id`` when given);
        anything else is refused (:class:`StoreFormatError`).  Structured arrays come nested,
        as from :meth:`load` (each under its name with ``flat=True``).
        """
        out = self._reader.load_path(path, device, keys, batch_id)
        return out if flat else nest(out)

    def iter_batches(
        self,
        keys: Sequence[str] | None = None,
        *,
        device: torch.device | str | None = None,
        weights_version: VersionFilter = None,
        worker: str | Collection[str] | None = None,
        env: EnvFilter = None,
    ) -> Iterator[tuple[BatchHandle, dict[str, Any]]]:
        """Yield ``(handle, {key: tensor [T, E, ...]})`` of each matching batch, by id (the
        filters as in :meth:`handles`).

        Batches deleted while iterating are skipped; a batch that is committed but cannot be
        read (its data missing or damaged) raises (:class:`~daskrl.BatchDataMissingError`,
        :class:`~daskrl.StoreFormatError`), it is never skipped silently.
        """
        for h in self.handles(weights_version=weights_version, worker=worker, env=env):
            try:
                yield h, self.load(h.batch_id, device=device, keys=keys)
            except BatchNotFoundError:
                continue

    def episodes(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Moved: ``daskrl.data.episodes(store, ...)``, with the same parameters."""
        _moved("episodes")

    def array_names(self, path: str) -> list[str]:
        """Names of the arrays of the batch in the container at ``path``."""
        return self._reader.array_names(path)

    def batch_sizes(self, batch_id: int, path: str) -> BatchSizes | None:
        """``(bytes of chunk data, bytes uncompressed)`` of a committed batch, from its index
        (None if it was deleted since it was listed)."""
        return self._reader.sizes(batch_id, path)

    def array_layouts(self, batch_id: int, path: str,
                      names: Sequence[str] | None = None) -> dict[str, ArrayLayout] | None:
        """Shape and dtype of arrays ``names`` (default: all) of a committed batch, from its
        index, each checked against the store format (None if the batch was deleted since it
        was listed; :class:`~daskrl.BatchDataMissingError` if it is committed but its data is
        missing, :class:`~daskrl.ArrayNotFoundError` for a name it lacks)."""
        return self._reader.array_layouts(batch_id, path, names)

    def to_dask(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Moved: ``daskrl.data.to_dask(store, ...)``, with the same parameters."""
        _moved("to_dask")

    def to_xarray(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Moved: ``daskrl.data.to_xarray(store, ...)``, with the same parameters."""
        _moved("to_xarray")

    # -- housekeeping --------------------------------------------------------------------------
    def attempt_sizes(self) -> dict[str, tuple[int, float]]:
        """``{path: (bytes, mtime)}`` of every file directly under ``batches/`` (containers,
        committed or not, and anything else put there)."""
        return self._housekeeping.attempt_sizes()

    def delete_batches(self, batch_ids: Iterable[int]) -> list[int]:
        """Delete committed batches: each commit record first, then the batch's data.

        Ids that are not committed are skipped.  Returns the ids deleted.  A task still
        retrying a deleted id could commit it again; delete only batches whose tasks are done.
        """
        return self._housekeeping.delete_batches(batch_ids)

    def keep_last(self, n: int) -> list[int]:
        """Delete all but the ``n`` committed batches with the highest ids; return those deleted.

        Batch ids grow with runs and, within a run, in submission order, so this keeps the
        newest batches (a replay buffer's window).
        """
        return self._housekeeping.keep_last(n)

    def collect_garbage(self, older_than: float = DEFAULT_GRACE_SECONDS, *,
                        dry_run: bool = False) -> GarbageReport:
        """Delete uncommitted attempts and ``*.partial`` files older than ``older_than`` seconds.

        Committed batches and their commit records are never touched.  Garbage younger than
        the grace period is kept (a writer may still be writing it; daskrl writes a whole
        batch in one burst and commits right after, so an hour is generous).  ``older_than=0``
        removes all garbage (only when no writer runs); ``dry_run`` reports what would be
        removed without removing it.
        """
        return self._housekeeping.collect_garbage(older_than, dry_run)


register_store_opener(TrajectoryStore)  # a handle without a store object opens one from its URL


def _moved(method: str) -> NoReturn:
    raise UsageError(f"store.{method}(...) moved to the readers' package, which the store does "
                     f"not depend on: use daskrl.data.{method}(store, ...), with the same "
                     "parameters.")


def _reopen(url: str, storage_options: Mapping[str, Any], read_only: bool,
            read_limits: ReadLimits | None = None) -> TrajectoryStore:
    return TrajectoryStore(url, storage_options, read_only=read_only, read_limits=read_limits)


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
