"""Stores whose every transition says where it came from: shared by
tests/test_dataset_batches.py (DataLoader worker processes) and
tests/unit/test_dataset_batches.py (the rest)."""

from __future__ import annotations

import numpy as np
import torch

from daskrl.store import TrajectoryStore


def tagged_store(url: str, n: int, T: int = 8, E: int = 4) -> None:
    """``n`` batches; each transition's ``value`` is ``1000 * batch + 10 * t + e``."""
    w = TrajectoryStore(url, read_only=False)
    w.initialize()
    t, e = np.meshgrid(np.arange(T), np.arange(E), indexing="ij")
    for b in range(n):
        arrays = {"origin": np.full((T, E), b, np.int64), "value": (1000 * b + 10 * t + e),
                  "reward": np.zeros((T, E), np.float32)}
        w.write_batch(b, arrays, {"frames": T * E, "weights_version": 0, "worker": "w",
                                  "device": "cpu", "episode_returns": [], "episode_lengths": [],
                                  "shape": [T, E]})


def check_real(origin: torch.Tensor, value: torch.Tensor, T: int = 8, E: int = 4) -> None:
    rest = value - 1000 * origin
    assert torch.all((rest // 10 < T) & (rest % 10 < E) & (rest >= 0))
