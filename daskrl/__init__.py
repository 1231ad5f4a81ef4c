"""daskrl: collect reinforcement-learning experience at cluster scale on Dask.

Weights travel as plain CPU numpy arrays, workers run batches of gymnasium envs on their own
devices, trajectories land as zarr chunks in any fsspec store, and only small handles come back.

The public surface, by stage of the data flow: weights (:func:`snapshot`), collecting
(:class:`Collector` and its :class:`CollectorConfig`), the store and its handles
(:func:`open_store`, :class:`BatchHandle`), reading for a learner (datasets, episodes:
:mod:`daskrl.data`), and the errors.  Where the workers come from is :mod:`daskrl.deploy`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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
    StreamError,
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

# Everything but the errors is imported on first use (PEP 562 ``__getattr__``), so that
# ``import daskrl`` (the CLI, a Dask worker's preload) does not import torch, gymnasium, zarr
# and Dask until something needs them; ``from daskrl import Collector`` imports what it needs.
_LAZY = {
    # weights: the learner's policy as plain CPU numpy arrays
    "WeightsSnapshot": "daskrl.weights",
    "snapshot": "daskrl.weights",
    # collecting: the learner's facade and its options
    "Collector": "daskrl.collect",
    "CollectorConfig": "daskrl.config",
    "Compression": "daskrl.config",
    "env_seed": "daskrl.worker._vector_envs",
    # the store: batches, their handles, housekeeping and read limits
    "BatchHandle": "daskrl.store",
    "GarbageReport": "daskrl.store",
    "ReadLimits": "daskrl.store",
    "TrajectoryStore": "daskrl.store",
    "open_store": "daskrl.store",
    # reading: what a learner trains from
    "Episode": "daskrl.data",
    "ReplayDataset": "daskrl.data",
    "TransitionDataset": "daskrl.data",
}
_SUBMODULES = frozenset({"cli", "collect", "config", "data", "deploy", "errors",
                         "integrations", "loggers", "policies", "store", "testing", "weights",
                         "worker"})

if TYPE_CHECKING:
    from daskrl.collect import Collector
    from daskrl.config import CollectorConfig, Compression
    from daskrl.data import Episode, ReplayDataset, TransitionDataset
    from daskrl.store import BatchHandle, GarbageReport, ReadLimits, TrajectoryStore, open_store
    from daskrl.weights import WeightsSnapshot, snapshot
    from daskrl.worker._vector_envs import env_seed


def __getattr__(name: str) -> Any:
    """Import a public name's module (or a subpackage) on first use."""
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, *_SUBMODULES})



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
    "StreamError",
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
