"""Weights through shared memory with a collector: one copy per version on the learner's
machine, read by the workers there; workers elsewhere make the collector fall back to Dask.
(The segments and their reader without Dask: tests/unit/test_shared_memory.py.)"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from cli_cluster import cli_cluster, scheduler_address, worker_args

import daskrl
from daskrl import deploy
from daskrl.testing import TagPolicy
from daskrl.weights._segments import shared_memory_dir

COUNTING = "daskrl.testing:Counting-v0"


def _segment_files() -> list[str]:
    return glob.glob(os.path.join(shared_memory_dir(), f"daskrl-weights-{os.getpid()}-*"))


_FULL_SHM_LEARNER = """
import sys
import gymnasium as gym
import daskrl
from daskrl.policies import MLPPolicy

if __name__ == "__main__":
    env = gym.make("CartPole-v1")
    policy = MLPPolicy(env.observation_space, env.action_space, hidden=(512, 512))  # 1 MiB
    with daskrl.Collector("CartPole-v1", policy, sys.argv[1], envs_per_worker=4,
                          frames_per_batch=256, total_frames=1024) as collector:
        frames = sum(h.frames for h in collector)
        collector.update_weights(policy, wait=True)
        print(collector.weights_transport, frames, daskrl.open_store(sys.argv[1]).frames)
"""


@pytest.mark.slow
def test_a_full_dev_shm_makes_the_collector_use_dask_transfers(tmp_path):
    """Docker gives containers a 64 MiB /dev/shm: a policy that does not fit is sent through
    Dask instead (the space is reserved at creation, so nothing crashes later)."""
    if os.geteuid() != 0 or shared_memory_dir() != "/dev/shm":
        pytest.skip("a private, tiny /dev/shm needs root and /dev/shm")
    script = tmp_path / "learner.py"
    script.write_text(_FULL_SHM_LEARNER)
    out = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         'mount -t tmpfs -o size=256k tmpfs /dev/shm && exec "$@"', "sh",
         sys.executable, str(script), str(tmp_path / "store")],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["dask", "1024", "1024"], out.stdout


def test_collector_shares_weights_and_cleans_up(client, tmp_path):
    policy = TagPolicy(dtype=torch.bfloat16)
    with daskrl.Collector(COUNTING, policy, str(tmp_path / "s"), client=client, rounds=False,
                          envs_per_worker=2, frames_per_batch=10, total_frames=200) as collector:
        assert collector.weights_transport == "shared-memory"
        for handle in collector:
            assert (handle.load(keys=["tag"])["tag"] == handle.weights_version).all()
            with torch.no_grad():
                policy.tag.fill_(collector.weights_version + 1)
            collector.update_weights(policy)
            policy.tag.data.fill_(-1)  # changed in place right after: must not reach workers
        assert 1 <= len(_segment_files()) <= 4
    assert not _segment_files()


def _remote_worker_args(sched, name: str) -> list[str]:
    """A `dask worker` with a /dev/shm of its own (a private tmpfs in its own mount
    namespace): to the learner's shared memory, it is on another machine."""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount -t tmpfs tmpfs /dev/shm && exec "$@"', "sh", *worker_args(sched, name)]


def _wait_for_workers(client, n: int) -> set[str]:
    deadline = time.monotonic() + 60
    while len(workers := set(client.scheduler_info()["workers"])) != n:
        assert time.monotonic() < deadline, workers
        time.sleep(0.1)
    return workers


@pytest.mark.slow
@pytest.mark.faults
def test_workers_on_another_machine_make_the_collector_fall_back_to_dask(tmp_path):
    if os.geteuid() != 0 or shared_memory_dir() != "/dev/shm":
        pytest.skip("a private /dev/shm for a worker needs root and /dev/shm")
    policy = TagPolicy()
    with cli_cluster(tmp_path, n_workers=1) as (sched, procs), \
            deploy.connect(scheduler_address(sched)) as d:
        client = d.client
        _wait_for_workers(client, 1)
        with daskrl.Collector(COUNTING, policy, str(tmp_path / "s"), client=client,
                              envs_per_worker=2, frames_per_batch=10, total_frames=None,
                              rounds=True) as collector:
            it = iter(collector)
            assert next(it).weights_version == 0  # the whole round: nothing in flight now
            assert collector.weights_transport == "shared-memory"
            # A worker joins from "another machine" and this machine's worker leaves: the
            # next batch runs there and cannot read shared memory, so the collector sends
            # weights through Dask from then on and submits the batch again.
            procs.start("remote", _remote_worker_args(sched, "remote"))
            _wait_for_workers(client, 2)
            with torch.no_grad():
                policy.tag.fill_(1)
            collector.update_weights(policy)
            procs.kill("worker-0")
            [remote] = _wait_for_workers(client, 1)
            handles = [next(it) for _ in range(3)]
            assert collector.weights_transport == "dask"
            for h in handles:
                assert h.worker == remote and h.weights_version == 1
                assert (h.load(keys=["tag"])["tag"] == 1).all()
            # update_weights(wait=True) reaches every worker, a new local one included.
            procs.start("local-again", worker_args(sched, "local-again"))
            _wait_for_workers(client, 2)
            with torch.no_grad():
                policy.tag.fill_(2)
            collector.update_weights(policy, wait=True)
            name = collector.plugin_name
            loaded = client.run(lambda dask_worker: dask_worker.plugins[name].version)
            assert set(loaded.values()) == {2}, loaded
            assert (next(it).load(keys=["tag"])["tag"] == 2).all()


@pytest.mark.slow
def test_a_remote_worker_at_start_switches_to_dask_before_the_first_batch(tmp_path):
    if os.geteuid() != 0 or shared_memory_dir() != "/dev/shm":
        pytest.skip("a private /dev/shm for a worker needs root and /dev/shm")
    with cli_cluster(tmp_path, n_workers=1) as (sched, procs), \
            deploy.connect(scheduler_address(sched)) as d:
        procs.start("remote", _remote_worker_args(sched, "remote"))
        _wait_for_workers(d.client, 2)
        with daskrl.Collector(COUNTING, TagPolicy(), str(tmp_path / "s"), client=d.client,
                              envs_per_worker=2, frames_per_batch=10,
                              total_frames=40) as collector:
            assert collector.weights_transport == "dask"
            handles = list(collector)
        assert len({h.worker for h in handles}) == 2
        assert np.all([h.weights_version == 0 for h in handles])
