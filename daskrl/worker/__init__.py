"""A Dask worker's side: its device, its loaded policy and its gymnasium envs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from daskrl.worker._devices import resolve_device


def __getattr__(name: str) -> Any:
    """``resolve_device`` on first use (``daskrl.config`` imports this package without torch)."""
    if name == "resolve_device":
        from daskrl.worker._devices import resolve_device

        return resolve_device
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["resolve_device"]
