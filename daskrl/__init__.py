"""daskrl: collect reinforcement-learning experience at cluster scale on Dask.

Weights travel as plain CPU numpy arrays, workers run batches of gymnasium envs on their own
devices, trajectories land as zarr chunks in any fsspec store, and only small handles come back.
"""

from __future__ import annotations

from .collector import Collector
from .config import CollectorConfig, Compression
from .dataset import ReplayDataset, TransitionDataset
from .errors import (
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
    StoreRecordWarning,
    StoreURLError,
    VersionMismatchError,
    WeightsIntegrityError,
    WeightsNotSharedError,
)
from .handles import BatchHandle
from .housekeeping import GarbageReport
from .readers import Episode
from .store import TrajectoryStore, open_store
from .weights import WeightsSnapshot, snapshot

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
