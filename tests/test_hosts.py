"""Several hosts for real: network namespaces on a private bridge (tests/beds/hosts.py).

Host 0 runs a CLI-started ``dask scheduler`` and the learner (a process of its own); hosts 1
and 2 run one ``dask worker`` each. Every host has its own ``/tmp`` and ``/dev/shm``; the store
is in the one directory all hosts share. Faults are real: a host's processes SIGKILLed, a
host's link taken down at the bridge (its packets silently dropped).
"""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest
from beds.dask_hosts import dask_hosts
from beds.hosts import leftover_namespaces

import daskrl

pytestmark = [
    pytest.mark.hosts,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
]

FRAMES_PER_BATCH = 40
ENVS = 2


def check_store(url: str, frames: int, handles: list[dict]) -> None:
    """Exact frames; every batch once (those handed over are those committed); every
    transition real; every episode continuous: its steps run without gap or repeat from 0, or
    from the start of a batch (an episode cut at a batch boundary)."""
    store = daskrl.open_store(url)
    assert store.frames == frames
    assert sum(h["frames"] for h in handles) == frames
    ids = [h["batch_id"] for h in handles]
    assert len(set(ids)) == len(ids), ids
    assert store.batch_ids() == sorted(ids)
    rows: dict[int, list[tuple[int, int]]] = {}  # episode -> [(step, t)]
    for bid in store.batch_ids():
        b = store.load(bid)
        obs, nxt = b["observation"].numpy(), b["next_observation"].numpy()
        np.testing.assert_array_equal(nxt - obs, np.broadcast_to([0, 1], obs.shape))
        eid, step = b["episode_id"].numpy(), b["step"].numpy()
        for t in range(eid.shape[0]):
            for e in range(eid.shape[1]):
                rows.setdefault(int(eid[t, e]), []).append((int(step[t, e]), t))
    for episode, steps in rows.items():
        steps.sort()
        first, t_first = steps[0]
        assert [s for s, _ in steps] == list(range(first, first + len(steps))), episode
        assert first == 0 or t_first == 0, (episode, steps[:3])


@pytest.fixture
def shared(tmp_path):
    yield tmp_path / "shared"
    left = leftover_namespaces(f"drl-{os.getpid()}-")
    assert not left, left


def _no_processes_left(cluster) -> None:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(cluster.scheduler_file) not in out


@pytest.mark.timeout(240)
def test_collection_across_hosts_has_exact_frames_and_dask_weights(shared):
    with dask_hosts(shared, 3) as cluster:
        cluster.wait_for_workers(2)
        store = str(shared / "store")
        learner = cluster.learner("plain", {
            "store": store, "update_weights": True,
            "collector": {"envs_per_worker": ENVS, "frames_per_batch": FRAMES_PER_BATCH,
                          "total_frames": FRAMES_PER_BATCH * 8}})
        result = learner.result(timeout=180)
        assert result["error"] is None, learner.log()
        handles = result["handles"]
        assert {h["worker"].split("//")[1].split(":")[0] for h in handles} == {
            cluster.hosts.address(1), cluster.hosts.address(2)}
        assert result["transport"] == "dask"  # /dev/shm is per host
        check_store(store, FRAMES_PER_BATCH * 8, handles)


def _partition_run(shared, name: str, *, update_weights: bool, cut_after: int,
                   restore_after: float | None = None, delay: float = 0.0,
                   total_batches: int = 12, timeout: float = 300) -> tuple[dict, str, object]:
    """Collect on three hosts; cut host 2's link after handle ``cut_after``."""
    import time

    with dask_hosts(shared, 3) as cluster:
        cluster.wait_for_workers(2)
        store = str(shared / "store")
        learner = cluster.learner(name, {
            "store": store, "update_weights": update_weights, "pause_after": [cut_after],
            "collector": {"envs_per_worker": ENVS, "frames_per_batch": FRAMES_PER_BATCH,
                          "total_frames": FRAMES_PER_BATCH * total_batches,
                          "env_kwargs": {"delay": delay}}})
        learner.wait_paused(cut_after)
        cluster.hosts.cut(2)
        t_cut = time.monotonic()
        learner.go(cut_after)
        if restore_after is not None:
            time.sleep(restore_after)
            cluster.hosts.restore(2)
        result = learner.result(timeout=timeout)
        result["after_cut"] = time.monotonic() - t_cut
        return result, store, learner


@pytest.mark.timeout(400)
def test_host_cut_off_during_update_weights_costs_a_bounded_wait(shared):
    result, store, learner = _partition_run(shared, "cut-update", update_weights=True,
                                            cut_after=1)
    assert result["error"] is None, learner.log()
    check_store(store, FRAMES_PER_BATCH * 12, result["handles"])
    print(result["update_seconds"], result["after_cut"])
