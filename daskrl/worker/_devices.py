"""Which device a worker runs its policy on.

``"auto"`` picks, on each worker, the device the worker declares (``DASKRL_DEVICE``), else its
first visible CUDA GPU, else ``mps``, else ``cpu``.  Deployments give each worker its own GPU by
setting ``CUDA_VISIBLE_DEVICES`` per worker (as dask-cuda does), so ``cuda`` means "this worker's
GPU".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from daskrl._settings import DeviceSetting
from daskrl.errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = ["DEVICE_ENV_VAR", "resolve_device"]

DEVICE_ENV_VAR = "DASKRL_DEVICE"




def _auto() -> torch.device:
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def resolve_device(setting: DeviceSetting, worker_name: str, worker_address: str) -> torch.device:
    """The device this worker uses, checked to exist here."""
    import torch

    if isinstance(setting, Mapping):
        text = setting.get(worker_name, setting.get(worker_address, "auto"))
    else:
        text = str(setting)
    if text == "auto":
        text = os.environ.get(DEVICE_ENV_VAR, "auto")
    dev = _auto() if text == "auto" else torch.device(text)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"worker {worker_name} ({worker_address}) was asked for device {text!r} but "
                "sees no CUDA GPU. Use device='auto' or declare this worker's device."
            )
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(
            f"worker {worker_name} ({worker_address}) was asked for device 'mps' but MPS is "
            "not available there. Use device='auto'."
        )
    return dev
