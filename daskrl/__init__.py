"""daskrl: collect reinforcement-learning experience at cluster scale on Dask.

Weights travel as plain CPU numpy arrays, workers run batches of gymnasium envs on their own
devices, trajectories land as zarr chunks in any fsspec store, and only small handles come back.

The public surface, by stage of the data flow: weights (:func:`snapshot`), collecting
(:class:`Collector` and its :class:`CollectorConfig`), the store and its handles
(:func:`open_store`, :class:`BatchHandle`), reading for a learner (datasets, episodes), and the
errors.  Where the workers come from is :mod:`daskrl.deploy`.
"""

from __future__ import annotations

# weights: the learner's policy as plain CPU numpy arrays
from daskrl.weights import WeightsSnapshot, snapshot

# collecting: the learner's facade and its options
from daskrl.collect import Collector
from daskrl.config import CollectorConfig, Compression
from daskrl.worker._vector_envs import env_seed

# the store: batches, their handles, housekeeping and read limits
from daskrl.store import (
    BatchHandle,
    GarbageReport,
    ReadLimits,
    TrajectoryStore,
    open_store,
)

# reading: what a learner trains from
from daskrl.store import Episode, ReplayDataset, TransitionDataset

# errors: one class per condition a caller may handle differently
from daskrl.errors import (
    ArrayNotFoundError,
    BatchDataMissingError,
    BatchNotFoundError,
    BatchTimeoutError,
    ClusterError,
    ClusterTimeoutError,
    CollectorClosedError,
    ConfigError,
    DaskrlError,
    DatasetIndexError,
    EnvError,
    EnvInfoError,
    ExportExistsError,
    InternalError,
    MissingDependencyError,
    PolicyError,
    ResumeError,
    ResumeMismatchError,
    SlurmError,
    SlurmJobError,
    StoreError,
    StoreFormatError,
    StoreOptionsRequiredError,
    StoreRecordWarning,
    StoreURLError,
    UnsupportedDtypeError,
    UsageError,
    VersionMismatchError,
    WeightsIntegrityError,
    WeightsNotSharedError,
    WeightsUnavailableError,
    MetricsLoggerWarning,
    WrapperError,
    EnvSpacesMismatchError,
)

__version__ = "0.1.0"

__all__ = [
    # weights
    "WeightsSnapshot",
    "snapshot",
    # collecting
    "Collector",
    "CollectorConfig",
    "Compression",
    "env_seed",
    # the store
    "BatchHandle",
    "GarbageReport",
    "ReadLimits",
    "TrajectoryStore",
    "open_store",
    # reading
    "Episode",
    "ReplayDataset",
    "TransitionDataset",
    # errors
    "ArrayNotFoundError",
    "BatchDataMissingError",
    "BatchNotFoundError",
    "BatchTimeoutError",
    "ClusterError",
    "ClusterTimeoutError",
    "CollectorClosedError",
    "ConfigError",
    "DaskrlError",
    "DatasetIndexError",
    "EnvError",
    "EnvInfoError",
    "ExportExistsError",
    "InternalError",
    "MissingDependencyError",
    "PolicyError",
    "ResumeError",
    "ResumeMismatchError",
    "SlurmError",
    "SlurmJobError",
    "StoreError",
    "StoreFormatError",
    "StoreOptionsRequiredError",
    "StoreRecordWarning",
    "StoreURLError",
    "UnsupportedDtypeError",
    "UsageError",
    "VersionMismatchError",
    "WeightsIntegrityError",
    "WeightsNotSharedError",
    "WeightsUnavailableError",
    "MetricsLoggerWarning",
    "WrapperError",
    "EnvSpacesMismatchError",
]
