"""The ``daskrl`` command: ``collect``, ``info``, ``inspect``, ``gc``."""

from __future__ import annotations

from daskrl.cli._app import main

__all__ = ["main"]
