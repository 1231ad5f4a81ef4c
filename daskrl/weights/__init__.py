"""The learner's weights as plain CPU numpy arrays: snapshots, checks, loading on a worker."""

from __future__ import annotations

from daskrl.weights._snapshot import (
    WeightsSnapshot,
    load_weights,
    policy_spec,
    snapshot,
    weights_layout,
)

__all__ = ["WeightsSnapshot", "load_weights", "policy_spec", "snapshot", "weights_layout"]
