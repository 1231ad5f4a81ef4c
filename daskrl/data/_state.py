"""Which arrays of a batch are a recurrent policy's state stored once per batch.

A batch of a recurrent policy stores ``policy_state`` (``policy_state/<name>`` for a mapping)
either before every step, ``[T, E, ...]``, read like any array, or (its commit record's
``"policy_state": "first"``) once, before the batch's first step, ``[E, ...]``: the one form
of array that is not time-major, which each reader places where it belongs
(``docs/recurrent.md``, "Reading recurrent batches").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["STATE_KEY", "is_state", "per_batch", "state_names"]

STATE_KEY = "policy_state"


def is_state(name: str) -> bool:
    """Whether array ``name`` (a flat name) is part of a policy's stored state."""
    return name.split("/")[0] == STATE_KEY


def per_batch(record: Mapping[str, Any]) -> bool:
    """Whether the batch of commit ``record`` stores its state once, ``[E, ...]``."""
    return record.get(STATE_KEY) == "first"


def state_names(names: Iterable[str]) -> list[str]:
    """The state's arrays among ``names``."""
    return [n for n in names if is_state(n)]
