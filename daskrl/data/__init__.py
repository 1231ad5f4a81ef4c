"""What a learner reads from a store: torch datasets (a replay buffer on the shared
filesystem), whole episodes, and the store as dask arrays or an xarray Dataset.

Everything here reads through the store's public API (:mod:`daskrl.store`); the store does
not depend on this package.

>>> store = daskrl.open_store("runs/cartpole")                     # doctest: +SKIP
>>> for ep in daskrl.data.episodes(store, ["reward"]): ...         # doctest: +SKIP
>>> rewards = daskrl.data.to_dask(store, ["reward"])["reward"]     # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskrl._lazy import lazy_names

if TYPE_CHECKING:
    from daskrl.data._dask_view import to_dask
    from daskrl.data._episodes import Episode, episodes
    from daskrl.data._replay import ReplayDataset
    from daskrl.data._samplers import GroupShuffleSampler
    from daskrl.data._transitions import TransitionDataset
    from daskrl.data._xarray_view import batch_to_xarray, to_xarray

__all__ = ["Episode", "GroupShuffleSampler", "ReplayDataset", "TransitionDataset",
           "batch_to_xarray", "episodes", "to_dask", "to_xarray"]

# Imported on first use (PEP 562): ``import daskrl.data`` brings neither torch nor dask.
_LAZY = {"to_dask": "_dask_view", "Episode": "_episodes", "episodes": "_episodes",
         "ReplayDataset": "_replay", "GroupShuffleSampler": "_samplers",
         "TransitionDataset": "_transitions", "batch_to_xarray": "_xarray_view",
         "to_xarray": "_xarray_view"}

__getattr__, __dir__ = lazy_names(__name__, _LAZY)
