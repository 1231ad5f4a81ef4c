"""What each worker would collect on: its name, threads, the device ``device="auto"`` resolves
to there, and the device variables it was started with (``daskrl info`` prints it)."""

from __future__ import annotations

import os
from typing import Any

from distributed import Client

from daskrl.errors import DaskrlError
from daskrl.worker._devices import DEVICE_ENV_VAR, resolve_device

__all__ = ["worker_report"]


def _device_on_worker(dask_worker: Any) -> dict[str, str]:
    out = {
        "name": str(dask_worker.name),
        DEVICE_ENV_VAR: os.environ.get(DEVICE_ENV_VAR, ""),
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
    }
    try:
        out["device"] = str(resolve_device("auto", out["name"], dask_worker.address))
    except DaskrlError as e:
        out["device"] = f"error: {e}"
    return out


def worker_report(client: Client) -> dict[str, dict[str, str]]:
    """Per worker address: its name, threads, the device ``device="auto"`` resolves to there
    (or ``"error: ..."``), and its ``DASKRL_DEVICE`` and ``CUDA_VISIBLE_DEVICES``."""
    report: dict[str, dict[str, str]] = client.run(_device_on_worker)
    threads = client.nthreads()  # the scheduler's count: no worker internals needed
    return {addr: {**r, "threads": str(threads.get(addr, "?"))}
            for addr, r in sorted(report.items())}
