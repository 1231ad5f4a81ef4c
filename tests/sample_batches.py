"""A small deterministic batch and its metadata, for tests that write stores directly."""

from __future__ import annotations

import numpy as np


def sample_arrays(T: int = 6, E: int = 2, seed: int = 0) -> dict[str, np.ndarray]:
    """Float observations and rewards and bool flags, ``[T, E, ...]``."""
    rng = np.random.default_rng(seed)
    return {
        "observation": rng.standard_normal((T, E, 3)).astype(np.float32),
        "reward": rng.standard_normal((T, E)).astype(np.float32),
        "terminated": rng.random((T, E)) < 0.3,
    }


def sample_meta(T: int = 6, E: int = 2) -> dict:
    """The batch metadata a worker records for a ``[T, E]`` batch."""
    return {"frames": T * E, "weights_version": 0, "worker": "w", "device": "cpu",
            "episode_returns": [], "episode_lengths": [], "shape": [T, E]}
