"""Weights: numpy snapshots of any dtype, checksums, structure shipping — no Dask needed."""

from __future__ import annotations

import io
import pickle
import pickletools
import re

import cloudpickle
import numpy as np
import pytest
import torch
from torch import nn

from daskrl import PolicyError, WeightsIntegrityError, snapshot
from daskrl.weights import load_weights, policy_spec


class Mixed(nn.Module):
    """Every dtype, a tied parameter, BatchNorm stats, a non-persistent buffer, a strided view."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(7, 5)
        self.out = nn.Linear(5, 7, bias=False)
        self.out.weight = self.emb.weight  # tied
        self.bn = nn.BatchNorm1d(5)
        self.f16 = nn.Parameter(torch.randn(3, 4).half())
        self.bf = nn.Parameter(torch.randn(4, 6).to(torch.bfloat16))
        self.f64 = nn.Parameter(torch.randn(2, dtype=torch.float64))
        base = torch.randn(6, 8)
        self.view = nn.Parameter(base.t()[::2])  # non-contiguous
        self.register_buffer("steps", torch.arange(5, dtype=torch.int32))
        self.register_buffer("mask", torch.tensor([True, False]))
        self.register_buffer("scratch", torch.full((3,), 7.0), persistent=False)
        self.register_buffer("scalar", torch.tensor(2.5, dtype=torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def _all_tensors(m: nn.Module) -> dict[str, torch.Tensor]:
    return dict(m.named_parameters()) | dict(m.named_buffers())


def _bits(t: torch.Tensor) -> bytes:
    t = t.detach().contiguous()
    return t.view(torch.uint8).numpy().tobytes() if t.dim() else t.reshape(1).view(torch.uint8).numpy().tobytes()


def test_snapshot_holds_only_plain_numpy_and_names_every_dtype():
    m = Mixed()
    snap = snapshot(m, version=3)
    assert snap.version == 3
    assert "out.weight" not in snap.names  # tied: shipped once
    assert "scratch" in snap.names  # non-persistent buffers travel too
    assert all(type(a) is np.ndarray and a.flags.c_contiguous for a in snap.arrays)
    dtypes = dict(zip(snap.names, snap.dtypes))
    assert dtypes["bf"] == "torch.bfloat16" and dtypes["f16"] == "torch.float16"
    assert dtypes["steps"] == "torch.int32" and dtypes["mask"] == "torch.bool"
    # What is pickled contains no torch object at all: no storages, no IPC handles.
    data = pickle.dumps(snap, protocol=5)
    globals_ = {arg for op, arg, _ in pickletools.genops(io.BytesIO(data))
                if op.name in ("GLOBAL", "STACK_GLOBAL") and arg}
    strings = [arg for op, arg, _ in pickletools.genops(io.BytesIO(data))
               if isinstance(arg, str)]
    assert not any("torch" in s for s in strings if s not in snap.dtypes), strings
    assert not any("torch" in str(g) for g in globals_)


def test_snapshot_is_a_copy_taken_at_call_time():
    m = Mixed()
    before = {k: _bits(v) for k, v in _all_tensors(m).items()}
    snap = snapshot(m, 0)
    with torch.no_grad():
        for t in _all_tensors(m).values():
            t.zero_() if t.dtype != torch.bool else t.logical_not_()
    got = snap.tensors()
    for name in snap.names:
        assert _bits(got[name]) == before[name], name


def test_structure_travels_without_data_and_rebuilds_bit_exact():
    m = Mixed()
    spec = policy_spec(m, None)
    payload = cloudpickle.dumps(spec)
    weight_bytes = sum(t.numel() * t.element_size() for t in _all_tensors(m).values())
    assert len(payload) < 20_000 and all(t.device.type == "meta" for t in spec.structure.parameters())
    assert weight_bytes > 0
    worker_side = cloudpickle.loads(payload).build("cpu")
    assert worker_side.out.weight is worker_side.emb.weight  # ties survive to_empty
    load_weights(worker_side, pickle.loads(pickle.dumps(snapshot(m, 1))))
    for name, t in _all_tensors(m).items():
        w = _all_tensors(worker_side)[name]
        assert w.dtype == t.dtype and _bits(w) == _bits(t), name
    assert torch.equal(worker_side.scratch, m.scratch)


def test_checksum_mismatch_names_the_tensor():
    snap = snapshot(Mixed(), 4)
    i = snap.names.index("bn.running_var")
    snap.arrays[i].flat[0] += 1  # corrupt in "transit"
    with pytest.raises(WeightsIntegrityError, match=re.escape("weights version 4: tensor 'bn.running_var'")):
        snap.verify()
    worker_side = policy_spec(Mixed(), None).build("cpu")
    with pytest.raises(WeightsIntegrityError):
        load_weights(worker_side, snap)


def test_unpicklable_policy_suggests_a_factory():
    class Local(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.lock = __import__("threading").Lock()

    with pytest.raises(PolicyError, match="Pass a zero-argument factory"):
        policy_spec(Local(), None)


def test_factory_spec_builds_on_the_worker():
    spec = policy_spec(nn.Linear(3, 2), lambda: nn.Linear(3, 2))
    assert spec.structure is None
    src = nn.Linear(3, 2)
    built = cloudpickle.loads(cloudpickle.dumps(spec)).build("cpu")
    load_weights(built, snapshot(src, 0))
    assert torch.equal(built.weight, src.weight) and torch.equal(built.bias, src.bias)


def test_shape_change_is_reported():
    built = policy_spec(nn.Linear(3, 2), None).build("cpu")
    with pytest.raises(PolicyError, match=re.escape("tensor 'weight' is (4, 3)")):
        load_weights(built, snapshot(nn.Linear(3, 4), 1))


def test_snapshot_reuses_released_arrays_without_mixing_versions():
    m = Mixed()
    old = snapshot(m, 0)
    with torch.no_grad():
        m.bf.add_(1)
        m.view.mul_(2)
    expected = snapshot(m, 1)
    new = snapshot(m, 1, out=dict(zip(old.names, old.arrays)))
    assert all(np.shares_memory(a, b) for a, b in zip(new.arrays, old.arrays))
    assert new.checksums == expected.checksums
    for a, b in zip(new.arrays, expected.arrays):
        assert a.tobytes() == b.tobytes()
    new.verify()
