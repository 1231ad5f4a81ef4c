"""Devices and weights on real spawn-started workers: the failures of the user reports, gone.

Report 000 (torchrl on macOS/mps): spawned workers pickle tensors through shared storages and
die with ``_share_filename_: only available on CPU``. Report 004 (ElegantRL on Windows/CUDA):
an actor sent through a pipe arrives with a buffer silently zeroed. Here weights travel as
checked numpy snapshots; these tests check, bit for bit, what every worker loaded. (The
learner's checks and device resolution, without a cluster: tests/unit/test_devices_weights.py.)
"""

from __future__ import annotations

import functools
import io
import pickle
import pickletools
import re

import pytest
import torch
from torch import nn

import daskrl
from daskrl import ConfigError, PolicyError
from daskrl.testing import TagPolicy, worker_weights
from daskrl.weights import policy_spec, snapshot

COUNTING = "daskrl.testing:Counting-v0"


class AwkwardPolicy(nn.Module):
    """Not plain CPU memory: bf16 parameters that are non-contiguous views, a tied weight,
    BatchNorm statistics, an integer buffer and a non-persistent buffer (ElegantRL's
    ``state_std`` is such a buffer)."""

    def __init__(self) -> None:
        super().__init__()
        base = torch.randn(8, 4, dtype=torch.bfloat16)
        self.w_in = nn.Parameter(base.t()[:, ::2].t())  # a strided view: shape (4, 4)
        self.w_out = nn.Parameter(torch.randn(6, 2, dtype=torch.bfloat16).t())  # (2, 6), non-contig
        self.bn = nn.BatchNorm1d(4).to(torch.bfloat16)
        self.register_buffer("state_std", torch.ones(4, dtype=torch.bfloat16), persistent=False)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
        self.head = nn.Linear(4, 4, bias=False).to(torch.bfloat16)
        self.tail = nn.Linear(4, 4, bias=False).to(torch.bfloat16)
        self.tail.weight = self.head.weight  # tied

    def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        x = (obs.to(torch.bfloat16) / self.state_std) @ self.w_in
        x = self.tail(self.head(x))
        logits = x @ self.w_out.t()[:4]
        return {"action": logits.float().argmax(-1), "score": logits.float().sum(-1)}


def _raw(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _learner_bytes(policy: nn.Module) -> dict[str, bytes]:
    tensors = dict(policy.named_parameters()) | dict(policy.named_buffers())
    return {k: _raw(t) for k, t in tensors.items()}


def _perturb(policy: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in list(policy.parameters()) + list(policy.buffers()):
            if t.is_floating_point():
                t.add_(torch.randn(t.shape, generator=g).to(t.dtype))
            else:
                t.add_(seed)


def test_awkward_policy_is_bit_exact_on_every_worker_across_versions(client, tmp_path):
    policy = AwkwardPolicy()
    assert not policy.w_in.is_contiguous() and policy.w_in.dtype == torch.bfloat16
    initial = _learner_bytes(policy)
    with daskrl.Collector("CartPole-v1", policy, str(tmp_path / "s"), client=client,
                          envs_per_worker=2, frames_per_batch=16, total_frames=None) as collector:
        # Version 0 was loaded by every worker when the collector started.
        assert all(w == initial for w in worker_weights(client, collector).values())
        for round_ in range(3):
            _perturb(policy, round_)
            expected = _learner_bytes(policy)
            version = collector.update_weights(policy, wait=True)
            _perturb(policy, 100 + round_)  # the learner moves on in place at once
            loaded = worker_weights(client, collector)
            assert len(loaded) == 2
            for worker, tensors in loaded.items():
                assert tensors.keys() == expected.keys(), worker
                for name, raw in tensors.items():
                    assert raw == expected[name], (worker, name, version)
            handles = [collector.submit() for _ in range(2)]
            assert {h.weights_version for h in client.gather(handles)} == {version}


def test_actions_come_from_the_version_the_handle_names(client, tmp_path):
    policy = TagPolicy(dtype=torch.bfloat16)
    with daskrl.Collector(COUNTING, policy, str(tmp_path / "s"), client=client, rounds=False,
                          envs_per_worker=2, frames_per_batch=10, total_frames=200) as collector:
        for handle in collector:
            tags = handle.load(keys=["tag"])["tag"]
            assert (tags == handle.weights_version).all(), handle
            with torch.no_grad():
                policy.tag.fill_(collector.weights_version + 1)
            collector.update_weights(policy)


def test_a_worker_asks_for_its_client_once_however_many_versions(client, tmp_path):
    # distributed's get_client sends the scheduler an event per call: a worker loading a
    # Dask-sent version every round (on-policy) must not send one per batch.
    before = len(client.get_events("worker-get-client"))
    policy = TagPolicy()
    with daskrl.Collector(COUNTING, policy, str(tmp_path / "s"), client=client, rounds=True,
                          shared_memory=False, envs_per_worker=2, frames_per_batch=10,
                          total_frames=10 * 2 * 6) as collector:
        for handle in collector:
            assert (handle.load(keys=["tag"])["tag"] == handle.weights_version).all()
            if not collector.in_flight:  # each round on a new version
                with torch.no_grad():
                    policy.tag.fill_(collector.weights_version + 1)
                collector.update_weights(policy)
    assert collector.weights_version == 6
    workers = len(client.scheduler_info()["workers"])
    assert len(client.get_events("worker-get-client")) - before <= workers


def _pickle_names(obj: object) -> set[str]:
    import cloudpickle

    data = cloudpickle.dumps(obj)
    return {arg for _, arg, _ in pickletools.genops(io.BytesIO(data)) if isinstance(arg, str)}


@pytest.mark.parametrize("shared_memory", [False, True], ids=["dask", "shared-memory"])
def test_what_travels_holds_no_tensor_data(client, tmp_path, shared_memory):
    policy = AwkwardPolicy()
    with daskrl.Collector("CartPole-v1", policy, str(tmp_path / "s"), client=client,
                          envs_per_worker=2, frames_per_batch=16, total_frames=32,
                          shared_memory=shared_memory) as collector:
        assert collector.weights_transport == ("shared-memory" if shared_memory else "dask")
        name = collector.weights_key(collector.weights_version)
        if shared_memory:
            # Tasks carry a manifest (names, offsets, checksums): no array, no tensor data;
            # nothing is scattered, and no worker holds weights in its Dask memory.
            manifest = collector.weights_ref()
            data = pickle.dumps(manifest, protocol=5)
            names = {a for _, a, _ in pickletools.genops(io.BytesIO(data)) if isinstance(a, str)}
            assert type(manifest).__name__ == "SharedWeights" and len(data) < 4096
            assert not [n for n in names
                        if "numpy" in n or ("torch" in n and n not in manifest.dtypes)], names
            assert client.get_dataset(name, default=None) is None
            held = client.run(lambda dask_worker: [type(v).__name__
                                                   for v in dask_worker.data.values()])
            assert not [t for ts in held.values() for t in ts if "Weights" in t], held
        else:
            # The weights as scattered: read back from the worker that holds them.
            key = client.get_dataset(name).key
            held = client.run(lambda dask_worker: (
                type(dask_worker.data[key]).__name__,
                [type(a).__module__ + "." + type(a).__name__ for a in dask_worker.data[key].arrays],
                pickle.dumps(dask_worker.data[key], protocol=5),
            ) if key in dask_worker.data else None)
            copies = [v for v in held.values() if v is not None]
            assert copies  # broadcast: each worker may hold its own copy
            for kind, array_types, data in copies:
                assert kind == "WeightsSnapshot" and set(array_types) == {"numpy.ndarray"}
                names = {a for _, a, _ in pickletools.genops(io.BytesIO(data))
                         if isinstance(a, str)}
                assert not [n for n in names
                            if "torch" in n and n not in snapshot(policy, 0).dtypes]
        # The structure, shipped once in the worker plugin: meta tensors only, no storage.
        plugin_names = _pickle_names(policy_spec(policy, None))
        assert "_rebuild_meta_tensor_no_storage" in plugin_names
        assert not [n for n in plugin_names if "storage" in n.lower() and "no_storage" not in n]
        assert not [n for n in plugin_names if "_rebuild_tensor" in n or "cuda" in n]
        list(collector)


def _make_policy(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 2), _Argmax())


class _Argmax(nn.Module):
    def forward(self, x):
        return x.argmax(-1)


def test_unpicklable_policy_suggests_a_factory_and_the_factory_works(client, tmp_path):
    import threading

    policy = _make_policy(8)
    policy.lock = threading.Lock()  # e.g. a logger or a file handle on the module
    with pytest.raises(PolicyError, match="Pass a zero-argument factory"):
        daskrl.Collector("CartPole-v1", policy, str(tmp_path / "a"), client=client)
    with daskrl.Collector("CartPole-v1", functools.partial(_make_policy, 8), str(tmp_path / "b"),
                          client=client, envs_per_worker=2, frames_per_batch=16,
                          total_frames=32) as collector:
        assert [h.frames for h in collector] == [16, 16]


def test_device_mapping_and_a_missing_gpu_fail_at_start(client, tmp_path):
    workers = client.scheduler_info()["workers"]
    names = {str(info["name"]) for info in workers.values()}
    with daskrl.Collector(COUNTING, TagPolicy(), str(tmp_path / "a"), client=client,
                          device=dict.fromkeys(names, "cpu"), envs_per_worker=2,
                          frames_per_batch=10, total_frames=20) as collector:
        assert {h.device for h in collector} == {"cpu"}
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    first = sorted(names)[0]
    with pytest.raises(ConfigError, match=re.escape(f"worker {first} (")):
        daskrl.Collector(COUNTING, TagPolicy(), str(tmp_path / "b"), client=client,
                         device={first: "cuda:1"}, envs_per_worker=2, frames_per_batch=10)
    assert not client.list_datasets()
