"""The metrics-logger protocol: what a :class:`~daskrl.Collector` calls with its running
metrics, and how a plain callable becomes a logger."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from daskrl.errors import UsageError

__all__ = ["CallbackLogger", "LoggerLike", "MetricsCallback", "MetricsLogger", "as_logger"]


@runtime_checkable
class MetricsLogger(Protocol):
    """What a collector sends its running metrics to (``Collector(..., loggers=[...])``).

    The collector calls :meth:`log_metrics` on the learner, in the thread that iterates it
    (never on a worker: loggers are not pickled), and :meth:`close` once when it closes.
    """

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Record ``metrics`` (key to number, keys of :data:`~daskrl.loggers.METRIC_KEYS`)
        at ``step``, the frames handed over to the learner so far."""

    def close(self) -> None:
        """Flush and release what the logger holds; the collector calls it once, last."""


MetricsCallback = Callable[[Mapping[str, float], int], object]
"""A callable taking ``(metrics, step)``, accepted in ``loggers`` as a logger without ``close``."""

LoggerLike = MetricsLogger | MetricsCallback
"""What ``Collector(..., loggers=[...])`` accepts: a :class:`MetricsLogger` or a callback."""


class CallbackLogger:
    """A :class:`MetricsLogger` that calls ``callback(metrics, step)``; closing does nothing."""

    def __init__(self, callback: MetricsCallback) -> None:
        self.callback = callback

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.callback(metrics, step)

    def close(self) -> None:
        """Nothing to release."""

    def __repr__(self) -> str:
        return f"CallbackLogger({self.callback!r})"


def as_logger(obj: Any, where: str = "loggers") -> Any:
    """``obj`` as a logger: an object with a callable ``log_metrics`` as it is (its ``close``
    is optional), a plain callable wrapped in :class:`CallbackLogger`; anything else is a
    :class:`~daskrl.UsageError` naming ``where``."""
    if callable(getattr(obj, "log_metrics", None)):
        return obj
    if callable(obj):
        return CallbackLogger(obj)
    raise UsageError(
        f"{where} got {obj!r} ({type(obj).__name__}), which is neither a metrics logger (an "
        "object with log_metrics(metrics, step) and close()) nor a callable(metrics, step): "
        "pass e.g. daskrl.loggers.TensorBoardLogger('runs/tb') or a function.")
