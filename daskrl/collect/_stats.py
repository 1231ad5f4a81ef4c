"""Running collection metrics, gathered from the handles a collector hands over.

Metrics are data, not log lines: :class:`CollectionStats` only counts, and
:meth:`daskrl.Collector.summary` returns its figures as a plain dict that a learner logs where it
wants (the examples use namespaced keys such as ``charts/SPS``).
"""

from __future__ import annotations

import collections
import math
import time
from typing import Any

from daskrl.store._handles import BatchHandle

__all__ = ["RECENT_EPISODES", "CollectionStats"]

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


def _mean(values: collections.deque[Any]) -> float:
    return float(sum(values) / len(values)) if values else math.nan
