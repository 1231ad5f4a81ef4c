"""A store as lazy dask arrays: one block per batch and array, read as ``load`` reads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from daskrl._nested import select
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

    Every array's metadata is checked against the allowlist before zarr opens it.  A batch
    deleted (pruned, ``keep_last``) before or while the view is built is left out of it; one
    deleted after it was built raises :class:`~daskrl.BatchNotFoundError` when its block is
    computed (the view's shape holds it): build the view again.

    Parameters
    ----------
    store
        The store to read.
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
    """
    return dask_view(store, keys, layout=layout, batch_ids=batch_ids)[0]


def dask_view(
    store: TrajectoryStore,
    keys: Sequence[str] | None = None,
    *,
    layout: str = "frames",
    batch_ids: Sequence[int] | None = None,
) -> tuple[dict[str, dask.array.Array], list[ViewBatch]]:
    """:func:`to_dask`'s arrays, and the :class:`ViewBatch` of each batch in them, in order (a
    batch deleted since it was listed is in neither)."""
    import dask
    import dask.array as da

    if layout not in _LAYOUTS:
        raise ConfigError(f"layout must be one of {_LAYOUTS}, got {layout!r}.")
    included: list[ViewBatch] = []
    recs = store.records()  # one listing: a batch pruned after it is left out below
    ids = list(batch_ids) if batch_ids is not None else list(recs)
    if not ids:
        return {}, included
    missing = [b for b in ids if b not in recs]
    if missing:
        raise BatchNotFoundError(f"no committed batches {missing} in store {store.url!r}.")
    names = None
    parts: dict[str, list[Any]] = {}
    load = dask.delayed(_load_array, pure=False)
    for bid in ids:
        path = recs[bid]["path"]
        layouts = store.array_layouts(bid, path, names)  # names None: every array
        if layouts is not None and names is None:
            # From the first batch: keys may name groups ("observation").
            names = list(layouts) if keys is None else select(list(layouts), keys)
            if keys is not None:
                layouts = store.array_layouts(bid, path, names)
        if layouts is None:
            continue  # deleted (pruned) since it was listed: not part of the view
        if layouts:
            included.append(ViewBatch(bid, _batch_shape(bid, path, store.url, layouts),
                                      int(recs[bid]["weights_version"])))
        for name, lay in layouts.items():
            arr = da.from_delayed(load(store, bid, path, name), shape=lay.shape,
                                  dtype=lay.dtype)
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
    return out, included


def _batch_shape(bid: int, path: str, url: str, layouts: dict[str, Any]) -> tuple[int, int]:
    """``(T, E)`` of a batch, which every one of its arrays ``[T, E, ...]`` must share."""
    shapes = {name: tuple(lay.shape[:2]) for name, lay in layouts.items()}
    if len(set(shapes.values())) != 1 or any(len(s) < 2 for s in shapes.values()):
        raise StoreFormatError(f"batch {bid} ({path!r}) of store {url!r}: its arrays are not "
                               f"all [T, E, ...] with one T and E (leading shapes {shapes}).")
    t, e = next(iter(shapes.values()))
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
