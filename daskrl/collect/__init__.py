"""The learner's side: the Collector facade that plans, supervises and hands over batches."""

from __future__ import annotations

from daskrl.collect._collector import Collector

__all__ = ["Collector"]
