"""A Dask worker's side: its device, its loaded policy and its gymnasium envs."""

from daskrl.worker._devices import resolve_device

__all__ = ["resolve_device"]
