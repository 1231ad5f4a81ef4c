"""The trajectory store: batches as zip containers of zarr v3 groups under an fsspec URL."""

from __future__ import annotations

from daskrl.store._dataset import ReplayDataset, TransitionDataset
from daskrl.store._episodes import Episode
from daskrl.store._format import ReadLimits
from daskrl.store._handles import BatchHandle
from daskrl.store._housekeeping import GarbageReport
from daskrl.store._samplers import GroupShuffleSampler
from daskrl.store._store import FORMAT_VERSION, TrajectoryStore, open_store

__all__ = ["FORMAT_VERSION", "BatchHandle", "Episode", "GarbageReport", "GroupShuffleSampler",
           "ReadLimits", "ReplayDataset", "TrajectoryStore", "TransitionDataset", "open_store"]
