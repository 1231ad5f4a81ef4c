"""What a store of ``daskrl.testing``'s counting envs must hold after faults: shared by the
fault and stream tests."""

from __future__ import annotations

import numpy as np

import daskrl
from daskrl.testing import check_episode_continuity


def check_counting_store(url: str, n_batches: int, frames: int) -> None:
    """Exactly the expected batches, each once; every transition real (a counting env's next
    observation is its observation plus ``[0, 1]``); no transition stored twice; episodes
    continuous (each starts at step 0 and runs on unbroken, or is cut at a batch boundary)."""
    store = daskrl.open_store(url)
    assert store.batch_ids() == list(range(n_batches))
    assert store.frames == frames
    seen: dict[int, set[int]] = {}
    for bid in store.batch_ids():
        b = store.load(bid)
        obs, nxt = b["observation"].numpy(), b["next_observation"].numpy()
        assert np.array_equal(nxt, obs + np.array([0, 1]))
        for eid, step in zip(b["episode_id"].numpy().ravel(), b["step"].numpy().ravel()):
            steps = seen.setdefault(int(eid), set())
            assert int(step) not in steps, (eid, step)
            steps.add(int(step))
    check_episode_continuity(store)
