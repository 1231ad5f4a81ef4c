"""A token of this process, by which a worker tells whether it shares the learner's."""

from __future__ import annotations

import uuid

__all__ = ["process_token"]

_PROCESS_TOKEN = uuid.uuid4().hex


def process_token() -> str:
    """A token of this process: a worker that returns the learner's shares its process."""
    return _PROCESS_TOKEN
