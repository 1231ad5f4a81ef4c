"""A store as lazy dask arrays: one block per batch and array, read as ``load`` reads."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from daskrl._nested import select
from daskrl.data._state import is_state, per_batch
from daskrl.errors import BatchNotFoundError, ConfigError, StoreError, StoreFormatError

if TYPE_CHECKING:
    import dask.array

    from daskrl.store import TrajectoryStore

__all__ = ["ViewBatch", "dask_view", "to_dask"]

_LAYOUTS = ("frames", "time", "env")


class ViewBatch(NamedTuple):
    """A batch in a dask view: its id, ``(T, E)`` and weights version."""

    batch_id: int
    shape: tuple[int, int]
    weights_version: int


def to_dask(
    store: TrajectoryStore,
    keys: Sequence[str] | None = None,
    *,
    layout: str = "frames",
    batch_ids: Sequence[int] | None = None,
) -> dict[str, dask.array.Array]:
    """The store as lazy dask arrays, one block per batch and array (read as ``load`` reads).

    Every array's metadata is checked against the allowlist before zarr opens it.

    A recurrent policy's ``policy_state`` stored before every step is ``[T, E, ...]`` and
    comes as any array.  Stored once per batch (``[E, ...]``, the state before the batch's
    first step) it has no time axis: it is ``[sum E, ...]`` in every layout, the batches'
    states joined along envs in batch order (row ``j`` of a batch's block is the state its
    env ``j`` started the batch from), and it is left out unless ``keys`` names it, but in
    layout ``"env"``, where it lines up with the other arrays' envs.
    A view does not join batches that store ``policy_state`` in different forms.  A batch
    deleted (pruned, ``keep_last``) before or while the view is built is left out of it; one
    deleted after it was built raises :class:`~daskrl.BatchNotFoundError` when its block is
    computed (the view's shape holds it): build the view again.

    Parameters
    ----------
    store
        The store to read.
    keys
        Arrays to include (default: those of the first batch, but a ``policy_state``
        stored once per batch in layouts ``"frames"`` and ``"time"``).
    layout
        ``"frames"`` (default): every batch flattened time-major to ``[T * E, ...]`` and
        concatenated, ``[frames, ...]``, in batch-id order; works for any mix of ``T`` and
        ``E``.  ``"time"``: batches concatenated along time, ``[sum T, E, ...]`` (all
        batches must have the same ``E``).  ``"env"``: along envs, ``[T, sum E, ...]``
        (same ``T``).
    batch_ids
        Batches to include (default: all committed, ascending).
    """
    return dask_view(store, keys, layout=layout, batch_ids=batch_ids,
                     batch_state=layout == "env")[0]


def dask_view(
    store: TrajectoryStore,
    keys: Sequence[str] | None = None,
    *,
    layout: str = "frames",
    batch_ids: Sequence[int] | None = None,
    batch_state: bool = False,
) -> tuple[dict[str, dask.array.Array], list[ViewBatch], set[str]]:
    """:func:`to_dask`'s arrays, the :class:`ViewBatch` of each batch in them, in order (a
    batch deleted since it was listed is in neither), and the names of the arrays stored once
    per batch (``[sum E, ...]``); ``batch_state``: include those by default too."""
    import dask
    import dask.array as da

    if layout not in _LAYOUTS:
        raise ConfigError(f"layout must be one of {_LAYOUTS}, got {layout!r}.")
    included: list[ViewBatch] = []
    recs = store.records()  # one listing: a batch pruned after it is left out below
    ids = list(batch_ids) if batch_ids is not None else list(recs)
    if not ids:
        return {}, included, set()
    missing = [b for b in ids if b not in recs]
    if missing:
        raise BatchNotFoundError(f"no committed batches {missing} in store {store.url!r}.")
    names = None
    once: set[str] | None = None  # the arrays stored once per batch, [E, ...]
    first_bid = -1
    parts: dict[str, list[Any]] = {}
    load = dask.delayed(_load_array, pure=False)
    for bid in ids:
        path = recs[bid]["path"]
        layouts = store.array_layouts(bid, path, names)  # names None: every array
        if layouts is not None and names is None:
            # From the first batch: keys may name groups ("observation").
            names = list(layouts) if keys is None else select(list(layouts), keys)
            if keys is None and per_batch(recs[bid]) and not batch_state:
                names = [n for n in names if not is_state(n)]
            if names != list(layouts):
                layouts = store.array_layouts(bid, path, names)
        if layouts is None:
            continue  # deleted (pruned) since it was listed: not part of the view
        this = {n for n in layouts if is_state(n)} if per_batch(recs[bid]) else set()
        if once is None:
            once, first_bid = this, bid
        elif this != once:
            raise StoreError(_mixed_forms(store.url, (first_bid, once), (bid, this)))
        if layouts:
            included.append(ViewBatch(bid, _batch_shape(bid, path, store.url, layouts, this,
                                                         recs[bid].get("shape", ())),
                                      int(recs[bid]["weights_version"])))
        for name, lay in layouts.items():
            arr = da.from_delayed(load(store, bid, path, name), shape=lay.shape,
                                  dtype=lay.dtype)
            if layout == "frames" and name not in this:
                arr = arr.reshape((-1, *arr.shape[2:]))
            parts.setdefault(name, []).append(arr)
    once = once or set()
    out = {}
    for name, arrs in parts.items():
        axis = 1 if layout == "env" and name not in once else 0
        try:
            out[name] = da.concatenate(arrs, axis=axis)
        except ValueError as e:
            shapes = sorted({tuple(a.shape) for a in arrs})
            raise StoreError(
                f"cannot concatenate {name!r} along {layout!r}: batch shapes {shapes} differ "
                f"off that axis ({e}). Use layout='frames', which fits any shapes."
            ) from e
    return out, included, once


def _mixed_forms(url: str, a: tuple[int, set[str]], b: tuple[int, set[str]]) -> str:
    def form(names: set[str]) -> str:
        return f"stores {sorted(names)} once, [E, ...]" if names else "stores no state once"

    return (f"batch {a[0]} of store {url!r} {form(a[1])} and batch {b[0]} {form(b[1])}: "
            "a view cannot join arrays of both forms (policy_state [E, ...] and [T, E, ...]). "
            "Pass batch_ids= of batches collected with one store_policy_state, or keys= "
            "without policy_state.")


def _batch_shape(bid: int, path: str, url: str, layouts: dict[str, Any],
                 once: Collection[str] = (), recorded: Sequence[int] = ()) -> tuple[int, int]:
    """``(T, E)`` of a batch, which every one of its arrays ``[T, E, ...]`` must share (and
    whose ``E`` its arrays stored once per batch, ``[E, ...]``, must start with)."""
    shapes = {name: tuple(lay.shape[:2]) for name, lay in layouts.items() if name not in once}
    if not shapes and len(recorded) == 2:  # only arrays [E, ...]: the record's (T, E)
        shapes = {"(commit record)": (int(recorded[0]), int(recorded[1]))}
    if len(set(shapes.values())) != 1 or any(len(s) < 2 for s in shapes.values()):
        raise StoreFormatError(f"batch {bid} ({path!r}) of store {url!r}: its arrays are not "
                               f"all [T, E, ...] with one T and E (leading shapes {shapes}).")
    t, e = next(iter(shapes.values()))
    bad = {n: tuple(layouts[n].shape) for n in once if tuple(layouts[n].shape[:1]) != (e,)}
    if bad:
        raise StoreFormatError(f"batch {bid} ({path!r}) of store {url!r}: its state stored "
                               f"once per batch is not [E, ...] with E = {e} (shapes {bad}).")
    return t, e


def _load_array(store: TrajectoryStore, bid: int, path: str, name: str) -> np.ndarray:
    """Array ``name`` of the batch at ``path``, as a block of the view."""
    try:
        return store.load_path(path, keys=[name], batch_id=bid, flat=True)[name].numpy()
    except BatchNotFoundError as e:
        # The view's shape holds the batch, so it cannot be left out once built.
        raise BatchNotFoundError(
            f"batch {bid} was deleted after this dask view was built (a dask array's shape "
            f"is fixed when it is made; the view leaves out the batches deleted before or "
            f"while it is built): build the view again, daskrl.data.to_dask(store, ...), to "
            f"read the batches committed now. ({e})") from None
