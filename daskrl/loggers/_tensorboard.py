"""TensorBoard: metrics as scalars through ``torch.utils.tensorboard.SummaryWriter``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from daskrl.errors import MissingDependencyError, UsageError

__all__ = ["MAX_QUEUE", "TensorBoardLogger"]

MAX_QUEUE = 1000
"""Events queued for the writer's thread before ``log_metrics`` waits for the disk (the
writer's own default, 10, is less than a batch's episodes often are, so the learner would wait
for the disk at almost every batch)."""


class TensorBoardLogger:
    """Write metrics as TensorBoard scalars (one event file under ``log_dir``).

    The writer is :attr:`writer`: log a learner's own scalars (losses) to the same run with
    :meth:`log_metrics` or with the writer itself. Needs ``pip install "daskrl[tensorboard]"``.

    Parameters
    ----------
    log_dir
        The run's directory (``tensorboard --logdir`` its parent to compare runs).
    **writer_options
        Passed to ``torch.utils.tensorboard.SummaryWriter`` (``flush_secs``, ``max_queue``,
        ``filename_suffix``...). ``max_queue`` defaults to ``MAX_QUEUE`` here, not the
        writer's 10: a batch's dozens of scalars then never wait for the disk.

    Examples
    --------
    >>> tb = TensorBoardLogger("runs/ppo/tb")
    >>> with Collector("CartPole-v1", policy, "runs/ppo/store", loggers=[tb]) as collector:
    ...     for handle in collector:
    ...         tb.log_metrics({"losses/value_loss": 0.1}, step=collector.summary()["frames"])
    """

    def __init__(self, log_dir: str | os.PathLike[str], **writer_options: Any) -> None:
        if not isinstance(log_dir, (str, os.PathLike)) or not os.fspath(log_dir):
            raise UsageError(f"TensorBoardLogger needs a directory (a str or a path), got "
                             f"{log_dir!r}.")
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise MissingDependencyError(
                f"TensorBoardLogger needs the tensorboard package, which is not installed ({e}). "
                'Install it with: pip install "daskrl[tensorboard]"') from None
        self.log_dir = os.fspath(log_dir)
        writer_options.setdefault("max_queue", MAX_QUEUE)
        self.writer = SummaryWriter(log_dir=self.log_dir, **writer_options)
        """The ``SummaryWriter`` (histograms, images, text: anything TensorBoard shows)."""

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Add each metric as a scalar at ``step``."""
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step)

    def flush(self) -> None:
        """Write what is queued to the event file now."""
        self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()

    def __repr__(self) -> str:
        return f"TensorBoardLogger({self.log_dir!r})"
