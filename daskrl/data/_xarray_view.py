"""A store as an ``xarray.Dataset`` backed by dask: :func:`~._dask_view.to_dask`'s arrays with
named dimensions and per-batch coordinates (needs ``daskrl[xarray]``).

Dimensions follow the format's rule (:func:`daskrl.store.dimension_names`): ``time`` and
``env`` shared by every array, ``<array>_0``, ``<array>_1``, ... of each array's own (so
Pendulum's ``observation_0`` of size 3 and ``action_0`` of size 1 never clash); layout
``"frames"`` merges ``time`` and ``env`` into ``frame``.  The names come from the rule, not
from the containers, so batches of format 2.0 (whose trailing names are null) and 2.1 read the
same.  A recurrent policy's ``policy_state`` stored once per batch (``[E, ...]``) has no
``time``: in :func:`batch_to_xarray` and in layout ``"env"`` its dimensions are ``(env,
policy_state_0, ...)``; in layouts ``"frames"`` and ``"time"``, where it is read only when
``keys`` names it, ``(batch_env, policy_state_0, ...)``, one entry per batch and env (the
batches in order).  Data is
read through daskrl's reader: every container and array document is checked
against the store's rules (``docs/store-format.md``) before a chunk is read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from daskrl.data._dask_view import dask_view
from daskrl.errors import ConfigError, MissingDependencyError, UsageError
from daskrl.store import TrajectoryStore, dimension_names, normalize_url

if TYPE_CHECKING:
    import xarray

    from daskrl.store import BatchHandle

__all__ = ["batch_to_xarray", "to_xarray"]

_AXIS = {"frames": "frame", "time": "time", "env": "env"}
"""The dimension batches are concatenated along, per layout."""


def _import_xarray() -> Any:
    try:
        import xarray
    except ImportError as e:
        raise MissingDependencyError(
            f'reading a store as an xarray Dataset needs xarray ({e}): pip install '
            '"daskrl[xarray]"'
        ) from e
    return xarray


def to_xarray(
    store: TrajectoryStore,
    keys: Sequence[str] | None = None,
    *,
    layout: str = "frames",
    batch_ids: Sequence[int] | None = None,
) -> xarray.Dataset:
    """The store's batches as one lazy ``xarray.Dataset`` (one dask block per batch and array).

    ``keys``, ``layout`` and ``batch_ids`` are :func:`~daskrl.data.to_dask`'s.  Each array is a
    data variable with dimensions ``(frame, <array>_0, ...)`` (layout ``"frames"``) or
    ``(time, env, <array>_0, ...)``; a ``policy_state`` stored once per batch (read only when
    ``keys`` names it, but in layout ``"env"``) has ``(env, ...)`` in layout ``"env"`` and
    ``(batch_env, ...)`` otherwise: the batches' states in batch order; the coordinates ``batch_id`` and ``weights_version``
    (lazy, along ``frame``, ``time`` or ``env``) say which batch each entry came from and the
    weights version that acted.  Raises :class:`~daskrl.MissingDependencyError` without
    xarray, :class:`~daskrl.StoreFormatError` when a batch's arrays disagree on ``[T, E]``,
    :class:`~daskrl.StoreError` when batches store ``policy_state`` in different forms,
    :class:`~daskrl.ConfigError` for an array named like a dimension (an extra policy output
    ``env``, say).
    """
    return _to_xarray(store, keys, layout=layout, batch_ids=batch_ids,
                      batch_state=layout == "env", state_dim="env" if layout == "env" else
                      "batch_env")


def _to_xarray(store: TrajectoryStore, keys: Sequence[str] | None, *, layout: str,
               batch_ids: Sequence[int] | None, batch_state: bool,
               state_dim: str) -> xarray.Dataset:
    """:func:`to_xarray`, with a state stored once per batch included by default
    (``batch_state``) and along dimension ``state_dim``."""
    xr = _import_xarray()
    import dask.array as da
    import numpy as np

    arrays, included, once = dask_view(store, keys, layout=layout, batch_ids=batch_ids,
                                       batch_state=batch_state)
    axis = _AXIS[layout]
    data: dict[str, Any] = {}
    for name, arr in arrays.items():
        if name in once:
            dims = dimension_names(name, arr.ndim, env_first=True)
            data[name] = ([state_dim, *dims[1:]], arr)
            continue
        dims = dimension_names(name, arr.ndim + (layout == "frames"))
        data[name] = (["frame", *dims[2:]] if layout == "frames" else dims, arr)
    clash = sorted(set(data) & {d for dims, _ in data.values() for d in dims})
    if clash:
        raise ConfigError(
            f"array {clash[0]!r} of store {store.url!r} has the name of a dimension of this "
            "view, which xarray cannot hold: pass keys= without it (and read it with "
            "to_dask() or load())."
        )
    sizes = [_length(b.shape, layout) for b in included]
    coords: dict[str, Any] = {}
    if included:
        for coord in ("batch_id", "weights_version"):
            coords[coord] = (axis, da.concatenate(
                [da.full(n, getattr(b, coord), dtype=np.int64, chunks=n)
                 for b, n in zip(included, sizes)]))
    return xr.Dataset(data, coords=coords, attrs={"store": store.url, "layout": layout})


def batch_to_xarray(handle: BatchHandle, keys: Sequence[str] | None = None, *,
                    store: TrajectoryStore | None = None,
                    storage_options: Mapping[str, Any] | None = None) -> xarray.Dataset:
    """One batch as a lazy ``xarray.Dataset`` backed by dask (needs ``daskrl[xarray]``): each
    array a variable with dimensions ``(time, env, <array>_0, ...)`` (a ``policy_state``
    stored once per batch: ``(env, policy_state_0, ...)``), read through daskrl's
    checked reader when computed; attributes ``batch_id``, ``weights_version``, ``worker``,
    ``device``.  ``store`` and ``storage_options``: as for :meth:`~daskrl.BatchHandle.load`."""
    reading = handle.reading_store(store, storage_options)
    if not isinstance(reading, TrajectoryStore):  # a handle reads through any ReadingStore
        raise UsageError(f"batch_to_xarray reads through a TrajectoryStore, and the handle of "
                         f"batch {handle.batch_id} has a {type(reading).__name__}: pass "
                         "store=open_store(url, storage_options).")
    store = reading
    if normalize_url(handle.store_url) != store.url:
        raise UsageError(f"the handle of batch {handle.batch_id} belongs to the store "
                         f"{handle.store_url!r}, not to {store.url!r}.")
    ds = _to_xarray(store, keys, layout="time", batch_ids=[handle.batch_id], batch_state=True,
                    state_dim="env")
    ds.attrs.update(batch_id=handle.batch_id, weights_version=handle.weights_version,
                    worker=handle.worker, device=handle.device)
    return ds


def _length(shape: tuple[int, int], layout: str) -> int:
    """A batch's extent along the dimension the layout concatenates on."""
    t, e = shape
    return {"frames": t * e, "time": t, "env": e}[layout]
