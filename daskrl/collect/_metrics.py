"""The running metrics a collector sends to its loggers: computed once per handle handed over,
on the learner, and fanned out with the failure rule (a logger that raises is closed, warned
about once and dropped; the others and the collection go on).

The loggers live here, on the learner: they are never pickled, never sent to a worker, and not
part of the run record. The keys are :data:`daskrl.loggers.METRIC_KEYS`.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from daskrl.errors import MetricsLoggerWarning, UsageError
from daskrl.loggers._keys import EPISODIC_LENGTH, EPISODIC_RETURN, worker_key
from daskrl.loggers._protocol import as_logger

if TYPE_CHECKING:
    from daskrl.collect._handover import CollectionStats
    from daskrl.store._handles import BatchHandle
    from daskrl.store._store import TrajectoryStore

__all__ = ["MetricsFeed", "batch_metrics", "container_bytes"]

logger = logging.getLogger(__name__)


def container_bytes(store: TrajectoryStore, handle: BatchHandle) -> int:
    """Size of the batch's container in the store (a stat, nothing read); 0 if it is gone
    (deleted meanwhile, e.g. by ``keep_last``)."""
    try:
        src = store.backend.byte_source(handle.path, f"batch {handle.batch_id}")
        try:
            return int(src.size())
        finally:
            src.close()
    except Exception:
        logger.debug("no size for batch %d (%r)", handle.batch_id, handle.path, exc_info=True)
        return 0


def batch_metrics(handle: BatchHandle, stats: CollectionStats, *, weights_version: int,
                  in_flight: int, store_bytes: int) -> dict[str, float]:
    """The per-batch metrics after ``handle`` was counted in ``stats`` (non-finite values,
    e.g. a rate with no time yet, are left out)."""
    s = stats.summary()
    w = s["workers"].get(handle.worker, {})
    metrics: dict[str, float] = {
        "charts/SPS": s["fps"],
        "collector/batches": s["batches"],
        "collector/episodes": s["episodes"],
        "collector/policy_lag": handle.policy_lag,
        "collector/policy_lag_mean": s["policy_lag_mean"],
        "collector/weights_version": weights_version,
        "collector/batch_weights_version": handle.weights_version,
        "collector/dropped_stale": s["dropped_stale"],
        "collector/in_flight": in_flight,
        "collector/store_bytes": store_bytes,
        worker_key(handle.worker, "fps"): w.get("fps", math.nan),
        worker_key(handle.worker, "rollout_fps"): w.get("rollout_fps", math.nan),
    }
    return {k: v for k, v in metrics.items() if math.isfinite(v)}


class MetricsFeed:
    """A collector's loggers, and what it has sent them."""

    def __init__(self, loggers: Sequence[Any] | None) -> None:
        if loggers is None:
            loggers = ()
        if isinstance(loggers, (str, bytes, Mapping)) or not isinstance(loggers, Sequence):
            raise UsageError(f"loggers must be a list of metrics loggers or callables, got "
                             f"{loggers!r}: e.g. loggers=[TensorBoardLogger('runs/tb')].")
        self._loggers = [as_logger(obj, f"loggers[{i}]") for i, obj in enumerate(loggers)]
        self.store_bytes = 0
        """Bytes of the containers of the batches handed over so far."""

    def __bool__(self) -> bool:
        return bool(self._loggers)

    @property
    def loggers(self) -> list[Any]:
        """The loggers still fed (one that raised is dropped)."""
        return list(self._loggers)

    def handed_over(self, handle: BatchHandle, stats: CollectionStats, *, weights_version: int,
                    in_flight: int, store: TrajectoryStore) -> None:
        """Send the metrics of ``handle`` (counted in ``stats`` already): one call per finished
        episode (its return and length), then one with the batch's figures, all at step
        ``stats.frames``."""
        if not self._loggers:
            return
        self.store_bytes += container_bytes(store, handle)
        step = stats.frames
        for ret, length in zip(handle.episode_returns, handle.episode_lengths):
            self._send({EPISODIC_RETURN: float(ret), EPISODIC_LENGTH: int(length)}, step)
        self._send(batch_metrics(handle, stats, weights_version=weights_version,
                                 in_flight=in_flight, store_bytes=self.store_bytes), step)

    def _send(self, metrics: Mapping[str, float], step: int) -> None:
        for target in list(self._loggers):
            try:
                target.log_metrics(metrics, step)
            except Exception as e:
                self._drop(target, e)

    def _drop(self, target: Any, error: Exception) -> None:
        self._loggers.remove(target)
        _close(target)  # first: with warnings as errors, what it wrote is still flushed
        warnings.warn(MetricsLoggerWarning(
            f"the metrics logger {target!r} raised {type(error).__name__}: {error}; it was "
            "closed (what it had written is kept) and gets no more metrics. The collection "
            "and the other loggers go on."), stacklevel=6)  # the learner's loop

    def close(self) -> None:
        """Close every logger still fed, once (a logger that raises on close is logged)."""
        loggers, self._loggers = self._loggers, []
        for target in loggers:
            _close(target)


def _close(target: Any) -> None:
    close = getattr(target, "close", None)
    if not callable(close):
        return
    try:
        close()
    except Exception:
        logger.warning("closing the metrics logger %r raised", target, exc_info=True)
