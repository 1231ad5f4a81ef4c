"""Weights through shared memory, without Dask: the learner's segments read in place by a
reader, bit exact and checksummed; readers elsewhere, races and stray writes are refused.
(Segments of a dead learner, and a full shared memory: tests/test_shared_memory.py.)"""

from __future__ import annotations

import dataclasses
import glob
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from daskrl import PolicyError, WeightsIntegrityError, WeightsNotSharedError
from daskrl.weights import policy_spec, snapshot, weights_layout
from daskrl.weights._segments import SegmentPool, shared_memory_dir
from daskrl.weights._shared_reader import SharedWeightsReader


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
