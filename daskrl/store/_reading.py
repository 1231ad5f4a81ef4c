"""Reading a batch's arrays: the zip container named by a commit record, checked before any
data is read and re-checked as committed after.

The bytes are read through :mod:`daskrl.store._format` (``read_index``, ``read_batch``) from the
backend's byte source; this module owns which path may be read, what a read that races a
deletion means, and how arrays become tensors on the device asked for.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from daskrl._nested import select
from daskrl.errors import (
    ArrayNotFoundError,
    BatchDataMissingError,
    BatchNotFoundError,
    StoreError,
    StoreFormatError,
)
from daskrl.store._commits import CommitIndex
from daskrl.store._documents import Documents
from daskrl.store._format import (
    ArrayLayout,
    BatchIndex,
    ByteSource,
    ReadLimits,
    read_batch,
    read_index,
)
from daskrl.store._layout import batch_id_of
from daskrl.store._records import check_attempt_path

__all__ = ["BatchSizes", "Reader"]

BatchSizes = tuple[int, int]
"""``(bytes of chunk data, bytes uncompressed)`` of one batch."""


class Reader:
    """Loads the batches of one store."""

    def __init__(self, docs: Documents, index: CommitIndex, limits: ReadLimits) -> None:
        self.docs = docs
        self.index = index
        self.backend = docs.backend
        self.url = docs.url
        self.limits = limits

    def _source(self, path: str, where: str) -> ByteSource:
        return self.backend.byte_source(path, where, self.docs.checked)

    def _batch_index(self, path: str, where: str, names: Sequence[str] | None) -> BatchIndex:
        src = self._source(path, where)
        try:
            return read_index(src, names, limits=self.limits)
        finally:
            src.close()

    def load_path(self, path: str, device: torch.device | str | None,
                  keys: Sequence[str] | None, batch_id: int | None) -> dict[str, torch.Tensor]:
        check_attempt_path(path, batch_id, f"batch path {path!r} of store {self.url!r}")
        batch_id = batch_id_of(path)
        where = f"batch {batch_id} ({path!r})" if batch_id is not None else f"batch {path!r}"
        dev = torch.device(device) if device is not None else torch.device("cpu")
        try:
            if not path.endswith(".zip"):
                raise StoreFormatError(f"{where} of {self.url!r} is not a zip container (format "
                                       "1.x, never released, is unsupported).")
            out = _load_tensors(self._source(path, where), keys, dev, self.limits)
        except BatchDataMissingError:
            self.index.check_still_committed(batch_id, path)  # deleted under the read?
            if batch_id is None:
                raise
            raise self.index.data_missing(batch_id, path) from None
        except (KeyError, StoreError):
            self.index.check_still_committed(batch_id, path)  # deleted under the read?
            raise
        # Deletion removes the commit record first, then the data: if the record still names
        # this attempt now, nothing was deleted under the read (no chunk read as a missing
        # all-zero chunk by mistake).
        self.index.check_still_committed(batch_id, path)
        return out

    def array_names(self, path: str) -> list[str]:
        return self._batch_index(path, f"batch {path!r}", []).arrays

    def array_layouts(self, bid: int, path: str,
                      names: Sequence[str] | None) -> dict[str, ArrayLayout] | None:
        """Validated layouts of arrays ``names`` (None: all) of a committed batch (None if it
        was deleted since it was listed; :class:`~daskrl.BatchDataMissingError` if it is
        committed but its data is missing)."""
        where = f"batch {bid} ({path!r})"
        try:
            return self._batch_index(path, where, names).layouts
        except ArrayNotFoundError as e:
            raise ArrayNotFoundError(f"{e.args[0]} (store {self.url!r}) Pass keys= present in "
                                     "every batch.") from None
        except (BatchDataMissingError, BatchNotFoundError):
            if self.index.still_committed(bid, path):
                raise self.index.data_missing(bid, path) from None
            return None

    def sizes(self, bid: int, path: str) -> BatchSizes | None:
        """Bytes of a committed batch's chunks and uncompressed arrays, from its index (None if
        it was deleted since it was listed; :class:`~daskrl.BatchDataMissingError` if it is
        committed but its data is missing)."""
        try:
            index = self._batch_index(path, f"batch {bid} ({path!r})", None)
        except (BatchDataMissingError, BatchNotFoundError):
            if self.index.still_committed(bid, path):
                raise self.index.data_missing(bid, path) from None
            return None
        return index.chunk_bytes, index.decoded_bytes


def _load_tensors(src: ByteSource, keys: Sequence[str] | None, dev: torch.device,
                  limits: ReadLimits) -> dict[str, torch.Tensor]:
    """The arrays ``keys`` of the container ``src`` as tensors on ``dev`` (closes ``src``).

    Arrays are read into numpy memory (malloc reuses freed memory; torch's allocator maps fresh
    pages, whose first touch costs more than reading a batch from the page cache), or, for a
    CUDA target, into pinned tensors moved with one copy each."""
    pinned: dict[str, torch.Tensor] = {}

    def pin(name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        t = torch.empty(shape, dtype=torch.from_numpy(np.empty(0, dtype)).dtype, pin_memory=True)
        pinned[name] = t
        return t.numpy()

    use_pin = dev.type == "cuda" and torch.cuda.is_available()
    try:
        index = read_index(src, [] if keys is not None else None, limits=limits)
        if keys is not None:  # a key may name a group of arrays: "observation" of a Dict space
            keys = select(index.arrays, keys)
        arrays = read_batch(src, index, keys, limits=limits, allocate=pin if use_pin else None)
    finally:
        src.close()
    if dev.type == "cpu":
        return {k: torch.from_numpy(a) for k, a in arrays.items()}
    return {k: (pinned[k] if use_pin else torch.from_numpy(a)).to(dev) for k, a in arrays.items()}
