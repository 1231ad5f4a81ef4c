"""The hand-over of batches to the learner: the policy-lag rule and the running statistics.

:class:`HandOver` decides, for each finished batch, whether the learner gets it (its
``policy_lag`` set) or it is dropped as too stale (``max_policy_lag``; its frames are then
collected again), and counts both. No Dask here.

Metrics are data, not log lines: :class:`CollectionStats` only counts, and
:meth:`daskrl.Collector.summary` returns its figures as a plain dict that a learner logs where it
wants (the examples use namespaced keys such as ``charts/SPS``).
"""

from __future__ import annotations

import collections
import logging
import math
import time
from typing import TYPE_CHECKING, Any

from daskrl.store._handles import BatchHandle

if TYPE_CHECKING:
    from daskrl.store._store import TrajectoryStore

__all__ = ["RECENT_EPISODES", "CollectionStats", "HandOver"]

logger = logging.getLogger(__name__)

RECENT_EPISODES = 100
"""``mean_return`` and ``mean_length`` average the last this many finished episodes."""


class CollectionStats:
    """Totals over the batches handed over to the learner, and over those dropped as stale."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.frames = 0
        self.batches = 0
        self.episodes = 0
        self.returns: collections.deque[float] = collections.deque(maxlen=RECENT_EPISODES)
        self.lengths: collections.deque[int] = collections.deque(maxlen=RECENT_EPISODES)
        self.lags: collections.Counter[int] = collections.Counter()
        self.dropped = 0
        self.dropped_frames = 0
        # address -> [batches, frames, rollout seconds, write seconds]
        self.workers: dict[str, list[float]] = {}

    def record(self, handle: BatchHandle) -> None:
        """Count a handle handed over to the learner (its ``policy_lag`` already set)."""
        self.frames += handle.frames
        self.batches += 1
        self.episodes += len(handle.episode_returns)
        self.returns.extend(handle.episode_returns)
        self.lengths.extend(handle.episode_lengths)
        self.lags[handle.policy_lag] += 1
        w = self.workers.setdefault(handle.worker, [0, 0, 0.0, 0.0])
        w[0] += 1
        w[1] += handle.frames
        w[2] += handle.rollout_seconds
        w[3] += handle.write_seconds

    def drop(self, handle: BatchHandle) -> None:
        """Count a batch that was not handed over because it was too stale."""
        self.dropped += 1
        self.dropped_frames += handle.frames

    def summary(self) -> dict[str, Any]:
        """The figures as a plain dict (see :meth:`daskrl.Collector.summary`)."""
        elapsed = time.perf_counter() - self.started
        lag_n = sum(self.lags.values())
        workers = {}
        for address, (batches, frames, rollout, write) in sorted(self.workers.items()):
            workers[address] = {
                "batches": int(batches),
                "frames": int(frames),
                # frames/s while stepping envs and the policy (writes excluded) ...
                "rollout_fps": frames / rollout if rollout > 0 else math.nan,
                # ... and this worker's share of the collection's wall-clock frames/s
                "fps": frames / elapsed if elapsed > 0 else 0.0,
                "write_seconds": write,
            }
        return {
            "frames": self.frames,
            "batches": self.batches,
            "seconds": elapsed,
            "fps": self.frames / elapsed if elapsed > 0 else 0.0,
            "episodes": self.episodes,
            "mean_return": _mean(self.returns),
            "mean_length": _mean(self.lengths),
            "policy_lag_mean": (
                sum(k * n for k, n in self.lags.items()) / lag_n if lag_n else math.nan
            ),
            "policy_lag_max": max(self.lags) if self.lags else 0,
            "policy_lag_counts": dict(sorted(self.lags.items())),
            "dropped_stale": self.dropped,
            "dropped_frames": self.dropped_frames,
            "workers": workers,
        }


class HandOver:
    """The policy-lag rule (``max_policy_lag``: ``None`` for no limit) and its statistics."""

    def __init__(self, max_policy_lag: int | None, store: TrajectoryStore | None = None) -> None:
        self.max_policy_lag = max_policy_lag
        self.store = store
        """Handed-over handles load through this store object (in this process)."""
        self.stats = CollectionStats()

    def take(self, handle: BatchHandle, newest_version: int) -> BatchHandle | None:
        """An iterator's batch: the handle with its lag, or None if it is too stale (dropped:
        the caller collects its ``frames`` again)."""
        lag = newest_version - handle.weights_version
        limit = self.max_policy_lag
        if limit is not None and lag > limit:
            self.stats.drop(handle)
            logger.debug("batch %d dropped: policy lag %d > max_policy_lag=%d",
                         handle.batch_id, lag, limit)
            return None
        return self.accept(handle, newest_version)

    def accept(self, handle: BatchHandle, newest_version: int) -> BatchHandle:
        """A batch the learner takes whatever its lag (``submit()``/``hand_over``)."""
        handle = handle._evolve(policy_lag=newest_version - handle.weights_version,
                                _store_object=self.store)
        self.stats.record(handle)
        return handle

    def summary(self) -> dict[str, Any]:
        """The statistics (see :meth:`daskrl.Collector.summary`)."""
        return self.stats.summary()


def _mean(values: collections.deque[Any]) -> float:
    return float(sum(values) / len(values)) if values else math.nan
