"""The same guarantees on CUDA: run where a GPU exists (skipped elsewhere by conftest)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import daskrl
from daskrl.testing import GRUPolicy, StepCountPolicy, TagPolicy, worker_weights
from daskrl.weights import load_weights, policy_spec, snapshot, weights_layout
from daskrl.weights._segments import SegmentPool
from daskrl.weights._shared_reader import SharedWeightsReader

pytestmark = pytest.mark.gpu


def test_weights_from_a_cuda_learner_load_bit_exact_onto_cuda():
    src = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.BatchNorm1d(7)).cuda()
    src[0].weight.data = src[0].weight.data.to(torch.bfloat16).float()  # exercise rounding paths
    snap = snapshot(src, 3)
    dst = policy_spec(src, None).build("cuda")
    load_weights(dst, snap)
    for (name, a), (_, b) in zip(src.state_dict().items(), dst.state_dict().items()):
        assert a.device.type == b.device.type == "cuda"
        assert torch.equal(a.view(-1).view(torch.uint8), b.view(-1).view(torch.uint8)), name


def test_shared_memory_weights_from_a_cuda_learner_load_bit_exact_onto_cuda():
    src = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.BatchNorm1d(7)).cuda()
    src = src.to(torch.bfloat16)
    pool = SegmentPool()
    try:
        _, manifest = pool.write(src, 0, weights_layout(src))
        dst = policy_spec(src, None).build("cuda")
        SharedWeightsReader().load(dst, manifest)
    finally:
        pool.close()
    for (name, a), (_, b) in zip(src.state_dict().items(), dst.state_dict().items()):
        assert b.device.type == "cuda"
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), name


def test_collect_on_cuda_workers(client, tmp_path):
    policy = TagPolicy().cuda()
    with daskrl.Collector("daskrl.testing:Counting-v0", policy, str(tmp_path / "s"),
                          client=client, device="cuda", envs_per_worker=2, frames_per_batch=10,
                          total_frames=40) as collector:
        handles = list(collector)
        assert {h.device.split(":")[0] for h in handles} == {"cuda"}
        loaded = worker_weights(client, collector)
        assert all(w["tag"] == policy.tag.detach().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()
                   for w in loaded.values())
        assert handles[0].load(device="cuda")["observation"].is_cuda


def test_recurrent_state_stays_on_cuda_and_is_stored_on_the_cpu(client, tmp_path):
    # the count policy: its state on the worker's GPU, and the stored arrays exact
    with daskrl.Collector("daskrl.testing:Counting-v0", StepCountPolicy().cuda(),
                          str(tmp_path / "count"), client=client, device="cuda",
                          envs_per_worker=2, frames_per_batch=14, total_frames=56,
                          rounds=True) as collector:
        for handle in collector:
            assert handle.device.startswith("cuda")
            b = {k: v.numpy() for k, v in handle.load().items()}  # stored as CPU arrays
            assert np.array_equal(b["count"], b["step"] + 1)
            assert np.array_equal(b["policy_state"][:, 0], b["step"][0])
            assert np.array_equal(b["is_init"], b["step"] == 0)
    # a GRU on the GPU, replayed on the same GPU from the stored state
    policy = GRUPolicy(4, 2).cuda()
    with daskrl.Collector("CartPole-v1", policy, str(tmp_path / "gru"), client=client,
                          device="cuda", envs_per_worker=4, frames_per_batch=64,
                          total_frames=256, rounds=True) as collector:
        for handle in collector:
            b = handle.load(device="cuda")
            state = b["policy_state"].clone()
            with torch.no_grad():
                for t in range(b["step"].shape[0]):
                    state[b["is_init"][t]] = 0.0
                    out, state = policy(b["observation"][t], state)
                    assert torch.allclose(out["logits"], b["logits"][t], atol=1e-5)
