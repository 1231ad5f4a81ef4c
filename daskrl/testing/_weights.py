"""What each worker's policy holds, bit for bit."""

from __future__ import annotations

from typing import Any

import torch


def worker_weights(client: Any, collector: Any) -> dict[str, dict[str, bytes]]:
    """The raw bytes of every parameter/buffer each worker's policy holds now, by worker.

    For checking, bit for bit, what workers loaded against what the learner sent.
    """
    name = collector.plugin_name

    def read(dask_worker: Any) -> dict[str, bytes]:
        policy = dask_worker.plugins[name].policy
        tensors = dict(policy.named_parameters()) | dict(policy.named_buffers())
        return {k: _raw_bytes(t) for k, t in tensors.items()}

    return client.run(read)


def _raw_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes()
