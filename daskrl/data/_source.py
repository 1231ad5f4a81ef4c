"""Where a dataset's batches come from: a store URL and its options, opened once per process
(so a dataset pickles to ``DataLoader`` workers as URL + ``storage_options``), and the checks
and splitting both datasets share.

A recurrent policy's state reaches a sample as the state before the sample's first step:
:meth:`StoreSource.load_flat` makes a state stored once per batch (``[E, ...]``) time-major
by repeating it along ``T`` (a view, which a dataset's cache then holds as ``T`` rows like any
array), samples of such a batch start only at ``t = 0`` (the only row whose state it holds),
and :func:`first_rows` keeps a window's first row of the state.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from daskrl._nested import nest
from daskrl.data._state import is_state
from daskrl.errors import ConfigError
from daskrl.store import TrajectoryStore, normalize_url, open_store

__all__ = ["StoreSource", "check_count", "first_rows", "split"]


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
        self.batch_state = keys is not None and any(is_state(k) for k in keys)
        """``keys`` name the state, so a batch that stores it once gives samples at ``t = 0``
        only (without it, such a batch's state is left out and samples start anywhere)."""
        self.once: set[int] = set()
        """The batches known to store their state once, ``[E, ...]``."""
        self._store: TrajectoryStore | None = None
        self._pid = -1

    def store(self) -> TrajectoryStore:
        if self._store is None or self._pid != os.getpid():
            self._store = open_store(self.url, self.options)
            self._pid = os.getpid()
        return self._store

    def load_flat(self, bid: int) -> dict[str, torch.Tensor]:
        """Batch ``bid``'s arrays by flat name, read through the store's checked path, each
        ``[T, E, ...]`` (a state stored once repeated along ``T``, or left out)."""
        flat = self.store().load(bid, None, self.keys, flat=True)
        if bid not in self.once:
            return flat
        if not self.batch_state:
            return {k: v for k, v in flat.items() if not is_state(k)}
        T = int(self.store().handle(bid).shape[0])
        return {k: v.expand(T, *v.shape) if is_state(k) else v for k, v in flat.items()}

    def starts_anywhere(self, bid: int) -> bool:
        """Whether samples of batch ``bid`` may start at any ``t`` (else only at ``t = 0``)."""
        return not (self.batch_state and bid in self.once)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_store"] = None
        return state


def check_count(name: str, v: Any, none_ok: bool) -> None:
    if (v is None and not none_ok) or (
            v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1)):
        raise ConfigError(f"{name} must be an integer >= 1{' or None' if none_ok else ''}, "
                          f"got {v!r}.")


def first_rows(flat: dict[str, torch.Tensor], length: int | None) -> dict[str, torch.Tensor]:
    """A stacked minibatch of windows (``length`` not None) with the state's arrays cut to
    their first row: the state before each window's first step, ``[n, ...]``."""
    if length is None:
        return flat
    return {k: v[:, 0] if is_state(k) else v for k, v in flat.items()}


def split(flat: Mapping[str, torch.Tensor]) -> list[dict[str, Any]]:
    """The samples of a stacked minibatch, each nested as an item is (views of ``flat``)."""
    columns = {k: v.unbind(0) for k, v in flat.items()}
    n = len(next(iter(columns.values()), ()))
    return [nest({k: c[i] for k, c in columns.items()}) for i in range(n)]
