"""Reading a batch's arrays: the container (format 2.x) or group (1.x) named by a commit
record, checked before any data is read and re-checked as committed after.

The data is read through the allowlist of :mod:`daskrl.store._format`; this module owns which
path may be read and what a read that races a deletion means.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from daskrl.errors import ArrayNotFoundError, BatchNotFoundError, StoreError
from daskrl.store._commits import CommitIndex
from daskrl.store._documents import Documents
from daskrl.store._layout import batch_id_of
from daskrl.store._records import check_attempt_path

__all__ = ["BatchSizes", "Reader"]

BatchSizes = tuple[int, int]
"""``(bytes of chunk data, bytes uncompressed)`` of one batch."""


class Reader:
    """Loads the batches of one store."""

    def __init__(self, docs: Documents, index: CommitIndex) -> None:
        self.docs = docs
        self.index = index
        self.backend = docs.backend
        self.url = docs.url

    def load_path(self, path: str, device: torch.device | str | None,
                  keys: Sequence[str] | None, batch_id: int | None) -> dict[str, torch.Tensor]:
        from daskrl.store._format.zarr_decode import read_arrays
        from daskrl.store._format.zip_decode import read_zip_arrays

        check_attempt_path(path, batch_id, f"batch path {path!r} of store {self.url!r}")
        batch_id = batch_id_of(path)
        where = f"batch {batch_id} ({path!r})" if batch_id is not None else f"batch {path!r}"
        zstore = self.backend.zarr_store
        try:
            if path.endswith(".zip"):
                out = read_zip_arrays(zstore, path, where, keys, device, self.url,
                                      self.docs.checked)
            else:
                out = read_arrays(zstore, path, where, keys, device, self.url)
        except BatchNotFoundError:
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
        from daskrl.store._format.zarr_decode import list_arrays
        from daskrl.store._format.zip_decode import read_index

        zstore = self.backend.zarr_store
        if path.endswith(".zip"):
            return sorted(read_index(zstore, path, f"batch {path!r}", self.url, keys=[])[0].docs)
        return list_arrays(zstore, path)

    def array_layouts(self, bid: int, path: str, names: Sequence[str]) -> dict[str, Any]:
        """Validated :class:`~daskrl.store._format.zarr_decode.ArrayLayout` of arrays
        ``names`` of a batch."""
        from daskrl.store._format.zarr_decode import (
            check_array_metadata,
            list_arrays,
            read_metadata,
        )
        from daskrl.store._format.zip_decode import read_index

        where = f"batch {bid} ({path!r})"
        zstore = self.backend.zarr_store
        if path.endswith(".zip"):
            try:
                return read_index(zstore, path, where, self.url, keys=names)[1]
            except BatchNotFoundError:
                raise
            except KeyError as e:
                raise ArrayNotFoundError(f"{where} of {self.url!r}: {e.args[0]} Pass keys= "
                                         "present in every batch.") from None
        out = {}
        docs = read_metadata(zstore, path, names)
        if names and all(d is None for d in docs) and not list_arrays(zstore, path):
            raise BatchNotFoundError(f"batch data {path!r} is missing from {self.url!r}.")
        for name, doc in zip(names, docs):
            if doc is None:
                raise ArrayNotFoundError(f"{where} of {self.url!r} has no array {name!r}; pass "
                                         "keys= present in every batch.")
            out[name] = check_array_metadata(doc, f"{where}, array {name!r}")
        return out

    def sizes(self, bid: int, path: str) -> BatchSizes | None:
        """Bytes of a committed batch's chunks and uncompressed arrays, from its index (None if
        it was deleted since it was listed; :class:`~daskrl.BatchDataMissingError` if it is
        committed but its data is missing)."""
        from daskrl.store._format.zarr_decode import (
            array_nbytes,
            check_array_metadata,
            list_arrays,
            read_metadata,
        )
        from daskrl.store._format.zip_decode import read_index

        where = f"batch {bid} ({path!r})"
        zstore = self.backend.zarr_store
        if path.endswith(".zip"):  # format 2.x: the container's directory has the sizes
            try:
                index, layouts = read_index(zstore, path, where, self.url)
            except BatchNotFoundError:
                if self.index.still_committed(bid, path):
                    raise self.index.data_missing(bid, path) from None
                return None
            raw = sum(math.prod(lay.shape) * lay.dtype.itemsize for lay in layouts.values())
            return index.chunk_bytes, raw
        names = list_arrays(zstore, path)
        if not names:
            if self.index.still_committed(bid, path):
                raise self.index.data_missing(bid, path)
            return None
        docs = dict(zip(names, read_metadata(zstore, path, names)))
        for name, doc in docs.items():
            check_array_metadata(doc, f"{where}, array {name!r}")
        chunks = sum(size for key, size, _ in self.backend.files(path)
                     if not key.endswith("zarr.json"))
        return chunks, array_nbytes(docs)
