"""Weights through shared memory: one copy per version on the learner's machine, read in place
by the workers there, checksummed; workers elsewhere make the collector fall back to Dask."""

from __future__ import annotations

import dataclasses
import glob
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_cluster import cli_cluster, scheduler_address, worker_args
from torch import nn

import daskrl
from daskrl import PolicyError, WeightsIntegrityError, WeightsNotSharedError, deploy
from daskrl.testing import TagPolicy
from daskrl.weights import policy_spec, snapshot, weights_layout
from daskrl.weights._segments import Segment, SegmentPool, shared_memory_dir
from daskrl.weights._shared_reader import SharedWeightsReader

COUNTING = "daskrl.testing:Counting-v0"


class Mixed(nn.Module):
    """bf16 non-contiguous views, an empty and a 0-dim tensor, integer and bool buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 4, dtype=torch.bfloat16).t())
        self.big = nn.Parameter(torch.randn(3 << 18))  # 3 MiB: several copy blocks
        self.register_buffer("empty", torch.zeros(0, 3))
        self.register_buffer("count", torch.tensor(7, dtype=torch.int64))
        self.register_buffer("mask", torch.tensor([True, False, True]))
        self.register_buffer("f16", torch.randn(5, dtype=torch.float16), persistent=False)


def _bytes(module: nn.Module) -> dict[str, bytes]:
    tensors = dict(module.named_parameters()) | dict(module.named_buffers())
    return {k: t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            for k, t in tensors.items()}


def _segment_files() -> list[str]:
    return glob.glob(os.path.join(shared_memory_dir(), f"daskrl-weights-{os.getpid()}-*"))


@pytest.fixture
def pool():
    pool = SegmentPool()
    yield pool
    pool.close()
    assert not _segment_files()


def test_versions_arrive_bit_exact_and_segments_are_reused(pool):
    src = Mixed()
    dst = policy_spec(src, None).build("cpu")
    reader = SharedWeightsReader()
    layout = weights_layout(src)
    seen_paths = set()
    for version in range(4):
        with torch.no_grad():
            src.big.mul_(-1.5)
            src.count.add_(1)
        snap, manifest = pool.write(src, version, layout)
        assert snap.checksums == snapshot(src, version).checksums
        reader.load(dst, manifest)
        assert _bytes(dst) == _bytes(src)
        seen_paths.add(manifest.path)
        if version:
            pool.release(version - 1)  # the previous version's segment becomes the spare
    assert len(seen_paths) == 2 and len(_segment_files()) == 2
    reader.close()


def test_a_reader_elsewhere_or_after_a_rewrite_refuses(pool, tmp_path):
    src = Mixed()
    dst = policy_spec(src, None).build("cpu")
    reader = SharedWeightsReader()
    _, manifest = pool.write(src, 0, weights_layout(src))
    # Another machine: no such file, or a same-named file without the learner's nonce.
    elsewhere = tmp_path / os.path.basename(manifest.path)
    with pytest.raises(WeightsNotSharedError, match="cannot open the learner's shared-memory"):
        reader.load(dst, dataclasses.replace(manifest, path=str(elsewhere)))
    data = Path(manifest.path).read_bytes()
    elsewhere.write_bytes(data[:8] + bytes(16) + data[24:])  # same content, another nonce
    with pytest.raises(WeightsNotSharedError, match="another file than the learner's"):
        reader.load(dst, dataclasses.replace(manifest, path=str(elsewhere)))
    # The learner rewrote the segment (a newer version) before this reader got to it.
    pool.release(0)
    _, newer = pool.write(src, 1, weights_layout(src))
    assert newer.path == manifest.path
    with pytest.raises(WeightsNotSharedError, match="version 0 was replaced"):
        reader.load(dst, manifest)
    reader.load(dst, newer)
    reader.close()


def test_changed_bytes_are_an_integrity_error_naming_the_tensor(pool):
    src = Mixed()
    dst = policy_spec(src, None).build("cpu")
    _, manifest = pool.write(src, 0, weights_layout(src))
    i = manifest.names.index("big")
    with open(manifest.path, "r+b") as f:  # a stray write into the segment
        f.seek(manifest.offsets[i] + 12345)
        byte = f.read(1)
        f.seek(manifest.offsets[i] + 12345)
        f.write(bytes([byte[0] ^ 0x10]))
    with pytest.raises(WeightsIntegrityError, match="tensor 'big' read from shared memory"):
        SharedWeightsReader().load(dst, manifest)


def test_a_structure_change_is_reported(pool):
    _, manifest = pool.write(nn.Linear(3, 4), 0, weights_layout(nn.Linear(3, 4)))
    with pytest.raises(PolicyError, match=r"tensor 'weight' is \(4, 3\)"):
        SharedWeightsReader().load(nn.Linear(3, 2), manifest)


def test_segments_of_a_dead_learner_are_swept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    stale = tmp_path / f"daskrl-weights-{int(dead.stdout)}-00ff"
    stale.write_bytes(b"x" * 100)
    mine = Segment(weights_layout(nn.Linear(2, 2)), str(tmp_path))
    assert not stale.exists() and os.path.exists(mine.path)
    assert oct(os.stat(mine.path).st_mode & 0o777) == "0o600"  # this user's only
    mine.close()
    assert not os.path.exists(mine.path)


def test_no_room_in_shared_memory_falls_back_to_plain_snapshots(tmpfs):
    big = nn.Linear(512, 512)  # 1 MiB: does not fit in 256 KiB
    assert Segment.create(weights_layout(big), str(tmpfs)) is None
    assert os.listdir(tmpfs) == []  # nothing half-made left behind


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
    with daskrl.Collector(COUNTING, policy, str(tmp_path / "s"), client=client, sync=False,
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
                              sync=True) as collector:
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
            name = collector._plugin_name
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
