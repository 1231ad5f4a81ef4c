"""The learner's side: the Collector facade that plans, supervises and hands over batches."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from daskrl.collect._collector import Collector

__all__ = ["Collector"]


def __getattr__(name: str) -> Any:
    """``Collector`` on first use (PEP 562): a submodule such as ``_env_list``, which the CLI
    uses before it starts a cluster, does not import torch with it."""
    if name == "Collector":
        from daskrl.collect._collector import Collector

        return Collector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
