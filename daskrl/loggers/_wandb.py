"""Weights & Biases: metrics as rows of a W&B run's history, charted against ``global_step``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from daskrl.errors import MissingDependencyError, UsageError

__all__ = ["WandbLogger"]


class WandbLogger:
    """Log metrics to a Weights & Biases run.

    Needs ``pip install "daskrl[wandb]"``.

    Parameters
    ----------
    run
        A run from ``wandb.init(...)``, left open by :meth:`close` (the caller finishes it);
        ``None`` starts one with ``wandb.init(**init_options)``, finished by :meth:`close`.
    step_metric
        The key the step is logged under; every metric is charted against it
        (``run.define_metric("*", step_metric=...)``). W&B keeps one value per key and history
        row, so each call is its own row: the episodes of one batch all appear, at one step.
    **init_options
        Passed to ``wandb.init`` (``project``, ``name``, ``config``, ``mode="offline"``...).
    """

    def __init__(self, run: Any = None, *, step_metric: str = "global_step",
                 **init_options: Any) -> None:
        try:
            import wandb
        except ImportError as e:
            raise MissingDependencyError(
                f"WandbLogger needs the wandb package, which is not installed ({e}). "
                'Install it with: pip install "daskrl[wandb]"') from None
        if run is not None and init_options:
            raise UsageError(f"WandbLogger got a run and wandb.init options "
                             f"{sorted(init_options)}: pass one or the other.")
        self.owns_run = run is None
        self.run = wandb.init(**init_options) if run is None else run
        """The W&B run."""
        self.step_metric = step_metric
        self.run.define_metric(step_metric)
        self.run.define_metric("*", step_metric=step_metric)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """One history row: ``metrics`` and ``{step_metric: step}``."""
        self.run.log({**metrics, self.step_metric: step})

    def close(self) -> None:
        """Finish the run if this logger started it."""
        if self.owns_run:
            self.run.finish()

    def __repr__(self) -> str:
        return f"WandbLogger(run={getattr(self.run, 'id', None)!r})"
