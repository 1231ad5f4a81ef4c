"""Dask preload of the embedded cluster's workers: import what a collecting worker runs (torch,
gymnasium, daskrl's worker side) while the worker process starts.

``import daskrl`` imports almost nothing (its names load on first use), so without this a
worker would import torch only when the first collector installs its plugin, after the
learner's own imports. Imported here, the workers' imports run while the cluster starts, which
``daskrl collect`` overlaps with the learner's imports and checks. Nothing learner-only
(``daskrl.collect``, the datasets, the loggers) is imported.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["WORKER_MODULES", "dask_setup"]

WORKER_MODULES = ("daskrl.worker._tasks", "daskrl.weights._publish")
"""What a worker runs: the plugin, the batch tasks and rollout, the weights' process token."""


def dask_setup(worker: Any) -> None:
    """Dask preload hook: import :data:`WORKER_MODULES` (before the worker joins)."""
    for name in WORKER_MODULES:
        importlib.import_module(name)
