"""The trajectory store: batches as zip containers of zarr v3 groups under an fsspec URL."""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskrl._lazy import lazy_names

if TYPE_CHECKING:
    from daskrl.store._dataset import ReplayDataset, TransitionDataset
    from daskrl.store._episodes import Episode
    from daskrl.store._format import ReadLimits
    from daskrl.store._handles import BatchHandle
    from daskrl.store._housekeeping import GarbageReport
    from daskrl.store._samplers import GroupShuffleSampler
    from daskrl.store._store import FORMAT_VERSION, TrajectoryStore, open_store

__all__ = ["FORMAT_VERSION", "BatchHandle", "Episode", "GarbageReport", "GroupShuffleSampler",
           "ReadLimits", "ReplayDataset", "TrajectoryStore", "TransitionDataset", "open_store"]

# Imported on first use (PEP 562), so that a submodule (``daskrl.store._housekeeping``, which
# the CLI's parser needs) does not bring torch and zarr with it.
_LAZY = {"ReplayDataset": "_dataset", "TransitionDataset": "_dataset", "Episode": "_episodes",
         "ReadLimits": "_format", "BatchHandle": "_handles", "GarbageReport": "_housekeeping",
         "GroupShuffleSampler": "_samplers", "FORMAT_VERSION": "_store",
         "TrajectoryStore": "_store", "open_store": "_store"}

__getattr__, __dir__ = lazy_names(__name__, _LAZY)
