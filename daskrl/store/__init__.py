"""The trajectory store: batches as zip containers of zarr v3 groups under an fsspec URL.

This is the storage engine (backends, records, commits, writing, reading, housekeeping and the
byte format).  What a learner reads from it (datasets, episodes, the dask and xarray views,
the summary and its plot) is :mod:`daskrl.data`, built on the names exported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from daskrl._lazy import lazy_names

if TYPE_CHECKING:
    from daskrl.store._env_select import EnvFilter, env_matcher
    from daskrl.store._format import ReadLimits
    from daskrl.store._format.encode import dimension_names
    from daskrl.store._handles import BatchHandle
    from daskrl.store._housekeeping import GarbageReport
    from daskrl.store._layout import ATTEMPT_NAME, run_of
    from daskrl.store._store import FORMAT_VERSION, TrajectoryStore, normalize_url, open_store

__all__ = ["ATTEMPT_NAME", "FORMAT_VERSION", "BatchHandle", "EnvFilter", "GarbageReport",
           "ReadLimits", "TrajectoryStore", "dimension_names", "env_matcher", "normalize_url",
           "open_store", "run_of"]

# Imported on first use (PEP 562), so that a submodule (``daskrl.store._housekeeping``, which
# the CLI's parser needs) does not bring torch and zarr with it.
_LAZY = {"EnvFilter": "_env_select", "env_matcher": "_env_select", "ReadLimits": "_format",
         "dimension_names": "_format.encode", "BatchHandle": "_handles",
         "GarbageReport": "_housekeeping", "ATTEMPT_NAME": "_layout", "run_of": "_layout",
         "FORMAT_VERSION": "_store", "TrajectoryStore": "_store", "normalize_url": "_store",
         "open_store": "_store"}

_MOVED = frozenset({"Episode", "GroupShuffleSampler", "ReplayDataset", "TransitionDataset"})
"""The readers' names, which live in ``daskrl.data`` (the store does not import it)."""

_getattr, __dir__ = lazy_names(__name__, _LAZY)


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        raise ImportError(f"daskrl.store.{name} moved to daskrl.data, the readers' package: "
                          f"from daskrl.data import {name} (or daskrl.{name}).")
    return _getattr(name)
