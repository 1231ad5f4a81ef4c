"""Where a dataset's batches come from: a store URL and its options, opened once per process
(so a dataset pickles to ``DataLoader`` workers as URL + ``storage_options``), and the checks
and splitting both datasets share."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from daskrl._nested import nest
from daskrl.errors import ConfigError
from daskrl.store import TrajectoryStore, normalize_url, open_store

__all__ = ["StoreSource", "check_count", "split"]


def _check_length(sequence_length: int | None) -> int:
    if sequence_length is None:
        return 1
    if isinstance(sequence_length, bool) or not isinstance(sequence_length, int) or sequence_length < 1:
        raise ConfigError(f"sequence_length must be an integer >= 1 or None, got {sequence_length!r}.")
    return sequence_length


class StoreSource:
    """URL + options; opens the store once per process."""

    def __init__(self, store: TrajectoryStore | str | os.PathLike[str],
                 storage_options: Mapping[str, Any] | None,
                 keys: Sequence[str] | None, sequence_length: int | None) -> None:
        if isinstance(store, TrajectoryStore):
            self.url = store.url
            self.options = dict(storage_options or store.storage_options)
        else:
            self.url = normalize_url(store)
            self.options = dict(storage_options or {})
        self.keys = list(keys) if keys is not None else None
        self.sequence_length = sequence_length
        self.length = _check_length(sequence_length)
        self._store: TrajectoryStore | None = None
        self._pid = -1

    def store(self) -> TrajectoryStore:
        if self._store is None or self._pid != os.getpid():
            self._store = open_store(self.url, self.options)
            self._pid = os.getpid()
        return self._store

    def load_flat(self, bid: int) -> dict[str, torch.Tensor]:
        """Batch ``bid``'s arrays by flat name, read through the store's checked path."""
        return self.store().load(bid, None, self.keys, flat=True)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_store"] = None
        return state


def check_count(name: str, v: Any, none_ok: bool) -> None:
    if (v is None and not none_ok) or (
            v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1)):
        raise ConfigError(f"{name} must be an integer >= 1{' or None' if none_ok else ''}, "
                          f"got {v!r}.")


def split(flat: Mapping[str, torch.Tensor]) -> list[dict[str, Any]]:
    """The samples of a stacked minibatch, each nested as an item is (views of ``flat``)."""
    columns = {k: v.unbind(0) for k, v in flat.items()}
    n = len(next(iter(columns.values()), ()))
    return [nest({k: c[i] for k, c in columns.items()}) for i in range(n)]
