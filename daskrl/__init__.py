"""daskrl: collect reinforcement-learning experience at cluster scale on Dask.

Weights travel as plain CPU numpy arrays, workers run batches of gymnasium envs on their own
devices, trajectories land as zarr chunks in any fsspec store, and only small handles come back.
"""

from __future__ import annotations

from daskrl.collect._collector import Collector
from daskrl.config import CollectorConfig, Compression
from daskrl.errors import (
    BatchDataMissingError,
    BatchNotFoundError,
    BatchTimeoutError,
    ClusterTimeoutError,
    CollectorClosedError,
    ConfigError,
    DaskrlError,
    EnvError,
    PolicyError,
    SlurmJobError,
    StoreError,
    StoreFormatError,
    StoreOptionsRequiredError,
    StoreRecordWarning,
    StoreURLError,
    VersionMismatchError,
    WeightsIntegrityError,
    WeightsNotSharedError,
)
from daskrl.store._dataset import ReplayDataset, TransitionDataset
from daskrl.store._episodes import Episode
from daskrl.store._handles import BatchHandle
from daskrl.store._housekeeping import GarbageReport
from daskrl.store._store import TrajectoryStore, open_store
from daskrl.weights._snapshot import WeightsSnapshot, snapshot

__version__ = "0.1.0"

__all__ = [
    "BatchDataMissingError",
    # data
    "BatchHandle",
    "BatchNotFoundError",
    "BatchTimeoutError",
    "ClusterTimeoutError",
    # collecting
    "Collector",
    "CollectorClosedError",
    "CollectorConfig",
    "Compression",
    "ConfigError",
    # errors
    "DaskrlError",
    "EnvError",
    "Episode",
    "GarbageReport",
    "PolicyError",
    "ReplayDataset",
    "SlurmJobError",
    "StoreError",
    "StoreFormatError",
    "StoreOptionsRequiredError",
    "StoreRecordWarning",
    "StoreURLError",
    "TrajectoryStore",
    "TransitionDataset",
    "VersionMismatchError",
    "WeightsIntegrityError",
    "WeightsNotSharedError",
    # weights
    "WeightsSnapshot",
    "open_store",
    "snapshot",
]
