"""What a learner reads from a store: selections of batches, whole episodes, a dask view.

Mixed into :class:`~daskrl.TrajectoryStore` (``daskrl.open_store(url)`` returns one).  Batches
are listed by their commit records only; their data is read through the allowlist of
:mod:`daskrl.store._format`.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from daskrl.errors import (
    ArrayNotFoundError,
    BatchDataMissingError,
    BatchNotFoundError,
    ConfigError,
    StoreError,
    StoreFormatError,
    StoreRecordWarning,
)
from daskrl.store._handles import BatchHandle
from daskrl.store._records import check_run_record

if TYPE_CHECKING:
    import dask.array

__all__ = ["Episode", "StoreReaders", "VersionFilter"]

VersionFilter = int | Collection[int] | Callable[[int], bool] | None
"""A weights version, a collection of them (``range`` works), or a predicate."""

_EPISODE_KEYS = ("episode_id", "terminated", "truncated")
_LAYOUTS = ("frames", "time", "env")


@dataclasses.dataclass(frozen=True)
class Episode:
    """One episode reassembled from the batches it spans, time-major ``[L, ...]``."""

    episode_id: int
    data: dict[str, torch.Tensor]
    """``{key: tensor [L, ...]}``, rows in the episode's order."""
    batch_ids: tuple[int, ...]
    """The batches it spans, in order."""
    complete: bool
    """It has every step from 0 on and ended with ``terminated`` or ``truncated``; False: cut
    (see the store format), or some of its batches were deleted."""

    @property
    def length(self) -> int:
        return int(self.data["episode_id"].shape[0])

    @property
    def total_reward(self) -> float:
        """Sum of rewards (float64); NaN when ``reward`` was not loaded."""
        r = self.data.get("reward")
        return float(r.double().sum()) if r is not None else float("nan")


def _matches(value: Any, selector: Any) -> bool:
    if selector is None:
        return True
    if callable(selector):
        return bool(selector(value))
    if isinstance(selector, (str, int)):
        return value == selector
    return value in selector


class StoreReaders:
    """Reading helpers; mixed into :class:`~daskrl.TrajectoryStore`."""

    url: str
    _zstore: Any
    _commits: dict[int, dict[str, Any]]
    _skipped_runs: dict[int, str]

    # provided by TrajectoryStore
    def refresh(self) -> None: ...
    def batch_ids(self) -> list[int]: ...
    def handle(self, batch_id: int) -> BatchHandle: ...
    def _get_json(self, key: str, what: str = "") -> dict[str, Any] | None: ...
    def _list_groups(self, prefix: str) -> list[str]: ...
    def _still_committed(self, batch_id: int, path: str) -> bool: ...
    def _data_missing(self, batch_id: int, path: str) -> StoreError: ...
    def _batch_index(self, path: str, where: str, names: Sequence[str] | None = None) -> Any: ...
    def load(self, batch_id: int, device: torch.device | str | None = None,
             keys: Sequence[str] | None = None) -> dict[str, torch.Tensor]: ...

    # -- counts and selections ------------------------------------------------------------------
    @property
    def num_batches(self) -> int:
        """Committed batches (same as ``len(store)``)."""
        return len(self.batch_ids())

    def records(self) -> dict[int, dict[str, Any]]:
        """Commit records by batch id (plain JSON metadata, see the store format)."""
        self.refresh()
        return {bid: dict(self._commits[bid]) for bid in sorted(self._commits)}

    def runs(self) -> dict[int, dict[str, Any]]:
        """Run records by run number: ``{"run", "settings", "started", ...}``.

        Records that cannot be read are skipped with a :class:`~daskrl.StoreRecordWarning`
        (listed by :meth:`skipped_records`)."""
        out = {}
        bad = []
        for name in self._list_groups("runs"):
            if name.isdigit():
                key = f"runs/{name}/zarr.json"
                try:
                    doc = self._get_json(key, "run record ")
                    if doc is not None:
                        out[int(name)] = check_run_record(
                            doc, int(name), f"run record {key!r} of store {self.url!r}")
                        self._skipped_runs.pop(int(name), None)
                except StoreFormatError as e:
                    if int(name) not in self._skipped_runs:
                        bad.append(int(name))
                    self._skipped_runs[int(name)] = str(e)
        if bad:
            warnings.warn(StoreRecordWarning(
                f"store {self.url!r}: skipped {len(bad)} unreadable run record(s) {bad[:10]}: "
                f"{self._skipped_runs[bad[0]]} (all: store.skipped_records())"), stacklevel=2)
        return out

    def weights_versions(self) -> list[int]:
        """Weights versions present among the committed batches, ascending."""
        return sorted({int(r["weights_version"]) for r in self.records().values()})

    def workers(self) -> list[str]:
        """Addresses of the workers that wrote the committed batches."""
        return sorted({str(r["worker"]) for r in self.records().values()})

    def handles(
        self, *, weights_version: VersionFilter = None, worker: str | Collection[str] | None = None
    ) -> list[BatchHandle]:
        """Handles of the committed batches that match, by ascending batch id.

        Parameters
        ----------
        weights_version
            A version, a collection of versions (e.g. ``range(5, 10)``), or a predicate
            ``f(version) -> bool``.
        worker
            A worker address or a collection of them.
        """
        return [BatchHandle.from_record(self.url, rec) for rec in self.records().values()
                if _matches(int(rec["weights_version"]), weights_version)
                and _matches(str(rec["worker"]), worker)]

    def iter_batches(
        self,
        keys: Sequence[str] | None = None,
        *,
        device: torch.device | str | None = None,
        weights_version: VersionFilter = None,
        worker: str | Collection[str] | None = None,
    ) -> Iterator[tuple[BatchHandle, dict[str, torch.Tensor]]]:
        """Yield ``(handle, {key: tensor [T, E, ...]})`` of each matching batch, by id.

        Batches deleted while iterating are skipped; a batch that is committed but cannot be
        read (its data missing or damaged) raises (:class:`~daskrl.BatchDataMissingError`,
        :class:`~daskrl.StoreFormatError`), it is never skipped silently.
        """
        for h in self.handles(weights_version=weights_version, worker=worker):
            try:
                yield h, self.load(h.batch_id, device=device, keys=keys)
            except BatchNotFoundError:
                continue

    # -- episodes -------------------------------------------------------------------------------
    def episodes(
        self,
        keys: Sequence[str] | None = None,
        *,
        complete_only: bool = True,
        device: torch.device | str | None = None,
    ) -> Iterator[Episode]:
        """Yield whole episodes, reassembled across the batches they span.

        A stream's envs continue across its batches, so an episode may start in one batch and
        end several batches later; its rows share one ``episode_id`` and are ordered by
        ``(batch_id, t)``.  Episodes are yielded as they end, reading batches in id order and
        holding only the open episodes' rows in memory.

        Parameters
        ----------
        keys
            Arrays to include (``episode_id``, ``terminated`` and ``truncated`` always are).
        complete_only
            Yield only complete episodes: every step from 0 on, ending with ``terminated`` or
            ``truncated``.  With False, the others come too, with ``complete=False``: episodes
            cut without a flag (``reset_at_each_iter``, rebuilt envs, a missing later batch, or
            still running at the newest batch) and episodes whose first or middle steps were
            in deleted batches (``keep_last``, ``delete_batches``).
        device
            Device of the yielded tensors.
        """
        need = None if keys is None else list(dict.fromkeys([*keys, *_EPISODE_KEYS, "step"]))
        drop_step = keys is not None and "step" not in keys
        runs = self.runs()
        open_eps: dict[int, list[tuple[int, dict[str, torch.Tensor]]]] = {}
        last_seen: dict[int, int] = {}
        dev = torch.device(device) if device is not None else None

        def emit(eid: int, ended: bool) -> Episode:
            pieces = open_eps.pop(eid)
            last_seen.pop(eid, None)
            # Whole only if its steps run 0, 1, 2, ...: a deleted batch leaves a hole.
            steps = torch.cat([p["step"] for _, p in pieces])
            complete = ended and torch.equal(steps, torch.arange(len(steps), dtype=steps.dtype))
            if drop_step:
                pieces = [(b, {k: v for k, v in p.items() if k != "step"}) for b, p in pieces]
            names = pieces[0][1].keys()
            data = {k: torch.cat([p[k] for _, p in pieces]) if len(pieces) > 1
                    else pieces[0][1][k].clone() for k in names}  # own memory, contiguous
            if dev is not None:
                data = {k: v.to(dev) for k, v in data.items()}
            bids = tuple(dict.fromkeys(b for b, _ in pieces))
            return Episode(int(eid), data, bids, complete)

        for bid in self.batch_ids():
            try:
                batch = self.load(bid, keys=need)
            except BatchNotFoundError:
                continue
            eid = batch["episode_id"].numpy()
            done = (batch["terminated"] | batch["truncated"]).numpy()
            T, E = eid.shape[:2]
            for e in range(E):
                col = eid[:, e]
                starts = np.flatnonzero(np.r_[True, col[1:] != col[:-1]])
                ends = np.r_[starts[1:], T]
                for a, b in zip(starts.tolist(), ends.tolist()):
                    i = int(col[a])
                    open_eps.setdefault(i, []).append((bid, {k: v[a:b, e] for k, v in batch.items()}))
                    last_seen[i] = bid
                    if done[b - 1, e]:
                        ep = emit(i, True)
                        if ep.complete or not complete_only:
                            yield ep
            settings = runs.get(bid // _ids_per_run(), {}).get("settings", {})
            for i in [i for i, b in last_seen.items() if b == bid]:
                if settings.get("reset_at_each_iter"):  # every open episode was cut here
                    ep = emit(i, False)
                    if not complete_only:
                        yield ep
                else:  # copy this batch's rows so the batch's tensors can be freed
                    b0, piece = open_eps[i][-1]
                    open_eps[i][-1] = (b0, {k: v.clone() for k, v in piece.items()})
        for i in sorted(open_eps):
            ep = emit(i, False)
            if not complete_only:
                yield ep

    def array_names(self, path: str) -> list[str]:
        """Names of the arrays of the batch (container) at ``path``."""
        return self._batch_index(path, f"batch {path!r}", []).arrays

    def _array_layouts(self, bid: int, path: str, names: Sequence[str]) -> dict[str, Any]:
        """Validated :class:`~daskrl.store._format.ArrayLayout` of arrays ``names`` of a batch."""
        where = f"batch {bid} ({path!r})"
        try:
            return self._batch_index(path, where, names).layouts
        except ArrayNotFoundError as e:
            raise ArrayNotFoundError(f"{e.args[0]} (store {self.url!r}) Pass keys= present in "
                                     "every batch.") from None

    # -- dask -----------------------------------------------------------------------------------
    def to_dask(
        self,
        keys: Sequence[str] | None = None,
        *,
        layout: str = "frames",
        batch_ids: Sequence[int] | None = None,
    ) -> dict[str, dask.array.Array]:
        """The store as lazy dask arrays, one block per batch and array (read as ``load`` reads).

        Parameters
        ----------
        keys
            Arrays to include (default: those of the first batch).
        layout
            ``"frames"`` (default): every batch flattened time-major to ``[T * E, ...]`` and
            concatenated, ``[frames, ...]``, in batch-id order; works for any mix of ``T`` and
            ``E``.  ``"time"``: batches concatenated along time, ``[sum T, E, ...]`` (all
            batches must have the same ``E``).  ``"env"``: along envs, ``[T, sum E, ...]``
            (same ``T``).
        batch_ids
            Batches to include (default: all committed, ascending).

        Every array's metadata is checked against the allowlist before zarr opens it.
        """
        import dask
        import dask.array as da

        if layout not in _LAYOUTS:
            raise ConfigError(f"layout must be one of {_LAYOUTS}, got {layout!r}.")
        ids = list(batch_ids) if batch_ids is not None else self.batch_ids()
        if not ids:
            return {}
        recs = self.records()
        missing = [b for b in ids if b not in recs]
        if missing:
            raise BatchNotFoundError(f"no committed batches {missing} in store {self.url!r}.")
        names = list(keys) if keys is not None else None
        parts: dict[str, list[Any]] = {}
        load = dask.delayed(_load_array, pure=False)
        for bid in ids:
            path = recs[bid]["path"]
            try:
                if names is None:
                    names = self.array_names(path)
                layouts = self._array_layouts(bid, path, names)
            except BatchDataMissingError:
                if self._still_committed(bid, path):
                    raise self._data_missing(bid, path) from None
                continue  # deleted (pruned) since it was listed: not part of the view
            for name, lay in layouts.items():
                arr = da.from_delayed(load(self, path, name), shape=lay.shape, dtype=lay.dtype)
                if layout == "frames":
                    arr = arr.reshape((-1, *arr.shape[2:]))
                parts.setdefault(name, []).append(arr)
        axis = 1 if layout == "env" else 0
        out = {}
        for name, arrs in parts.items():
            try:
                out[name] = da.concatenate(arrs, axis=axis)
            except ValueError as e:
                shapes = sorted({tuple(a.shape) for a in arrs})
                raise StoreError(
                    f"cannot concatenate {name!r} along {layout!r}: batch shapes {shapes} differ "
                    f"off that axis ({e}). Use layout='frames', which fits any shapes."
                ) from e
        return out


def _load_array(store: Any, path: str, name: str) -> np.ndarray:
    return store.load_path(path, keys=[name])[name].numpy()


def _ids_per_run() -> int:
    from daskrl.store._store import BATCH_IDS_PER_RUN

    return BATCH_IDS_PER_RUN
