"""Weights through the store (``weights_in_store=True``): each version written once by the
learner, read once per host by its workers.

Through Dask, a version costs the scheduler a few messages per worker and the learner (or a
seed worker) one transfer per host: at 1,000 workers a 100 MiB version is seconds of the
scheduler's time (``docs/scaling.md``).  Here the learner writes the version to the store that
the batches go to (a shared filesystem or an object store every worker already reads and
writes), and tasks carry only a small :class:`StoreWeights` manifest.  The first worker of a
host to need the version reads it from the store and leaves it as the host's copy
(:mod:`daskrl.weights._host_copies`); the host's other workers read that copy.

The file is a segment's bytes (:mod:`daskrl.weights._segments`: header with a random nonce and
the version, then each tensor, aligned), under
``runs/weights-<collector>/v<version>-<nonce>``.  A reader checks the size, the header and each
tensor's CRC32C against the manifest: a file changed, truncated, replaced or linked elsewhere
is refused with :class:`~daskrl.WeightsIntegrityError`, a missing one with
:class:`~daskrl.WeightsUnavailableError`.  The learner removes a version once no batch needs
it, and all of them when the collector closes.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import TYPE_CHECKING

import numpy as np

from daskrl._checksums import crc32c
from daskrl.errors import (
    BatchDataMissingError,
    StoreError,
    WeightsIntegrityError,
    WeightsUnavailableError,
)
from daskrl.store._layout import weights_dir, weights_key
from daskrl.weights._segments import (
    HEADER,
    MAGIC,
    TensorManifest,
    tensor_nbytes,
    tensor_offsets,
)
from daskrl.weights._snapshot import WeightsSnapshot, dtype_from_name, numpy_dtype

if TYPE_CHECKING:
    from daskrl.store._backends import Backend

__all__ = ["StoreWeights", "StoreWeightsWriter", "read_store_weights"]


@dataclasses.dataclass(frozen=True)
class StoreWeights(TensorManifest):
    """What travels with a task for a version in the store: where it is and what it holds."""

    store: str
    """The store's URL (for messages)."""
    key: str
    size: int
    """Bytes of the file."""
    nonce: bytes


class StoreWeightsWriter:
    """The learner's side: writes versions to ``backend`` and removes them."""

    def __init__(self, backend: Backend, store_url: str, collector: str) -> None:
        self.backend = backend
        self.store_url = store_url
        self.collector = collector
        self.versions: dict[int, StoreWeights] = {}

    def write(self, snap: WeightsSnapshot) -> StoreWeights:
        """Write ``snap`` as a new file; its manifest (raises :class:`StoreError`)."""
        shapes = tuple(tuple(a.shape) for a in snap.arrays)
        offsets, size = tensor_offsets(list(zip(snap.names, snap.dtypes, shapes)))
        nonce = secrets.token_bytes(16)
        head = bytearray(offsets[0] if offsets else size)
        HEADER.pack_into(head, 0, MAGIC, nonce, snap.version)
        parts: list[bytes | bytearray | memoryview] = [head]
        end = len(head)
        for arr, off in zip(snap.arrays, offsets):
            if off > end:
                parts.append(bytes(off - end))
            parts.append(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data)
            end = off + arr.nbytes
        parts.append(bytes(size - end))
        key = weights_key(self.collector, snap.version, nonce.hex())
        try:
            self.backend.write_new(key, parts)
        except OSError as e:
            raise StoreError(
                f"the learner could not write weights version {snap.version} to the store "
                f"{self.store_url!r} ({type(e).__name__}: {e}); weights_in_store=True needs "
                "the store writable by the learner."
            ) from e
        out = StoreWeights(snap.version, snap.names, snap.dtypes, shapes, offsets,
                           snap.checksums, self.store_url, key, size, nonce)
        self.versions[snap.version] = out
        return out

    def remove(self, version: int) -> None:
        """Remove ``version``'s file (a batch still loading it finds it missing)."""
        w = self.versions.pop(version, None)
        if w is not None:
            try:
                self.backend.delete(w.key)
            except OSError:
                pass  # removed with the directory at close

    def close(self) -> None:
        """Remove every version, and the collector's directory of them."""
        for version in list(self.versions):
            self.remove(version)
        try:
            self.backend.delete_prefix(weights_dir(self.collector))
        except OSError:
            pass


def read_store_weights(backend: Backend, w: StoreWeights, where: str) -> WeightsSnapshot:
    """Read version ``w`` from the store and check it against its manifest (size, header,
    every tensor's checksum); its arrays are read-only. Raises
    :class:`WeightsUnavailableError` if the file is gone, :class:`WeightsIntegrityError` if it
    is not the learner's bytes (no more than the manifest's size is ever read)."""
    what = f"weights version {w.version} ({w.key!r} in the store {w.store!r})"
    try:
        src = backend.byte_source(w.key, what)
    except BatchDataMissingError:
        raise WeightsUnavailableError(
            f"{where}: {what} is missing: the learner removed it (the collector closed, or no "
            "batch needs that version any more) or something else deleted it."
        ) from None
    except StoreError as e:  # a link, a FIFO, a device: not a file daskrl wrote
        raise WeightsIntegrityError(f"{where}: {e}") from None
    try:
        size = src.size()
        if size != w.size:
            raise WeightsIntegrityError(
                f"{where}: {what} has {size} bytes where the learner wrote {w.size}: the file "
                "was changed or replaced; call update_weights() again."
            )
        ranges = [(0, HEADER.size)] + [(off, tensor_nbytes(d, s))
                                       for off, d, s in zip(w.offsets, w.dtypes, w.shapes)]
        parts = src.read_ranges(ranges)
    except BatchDataMissingError:
        raise WeightsUnavailableError(f"{where}: {what} was removed while it was read.") from None
    finally:
        src.close()
    magic, nonce, version = HEADER.unpack_from(parts[0], 0)
    if magic != MAGIC or nonce != w.nonce or version != w.version:
        raise WeightsIntegrityError(
            f"{where}: {what} is not the file the learner wrote (its header differs): the file "
            "was changed or replaced; call update_weights() again."
        )
    arrays = []
    for raw, name, d, s, expected in zip(parts[1:], w.names, w.dtypes, w.shapes, w.checksums):
        got = crc32c(raw)
        if got != expected:
            raise WeightsIntegrityError(
                f"{where}: {what}: tensor {name!r} has checksum {got:#010x}, the learner "
                f"computed {expected:#010x}: its bytes in the store were changed; the worker "
                "did not load them. Call update_weights() again."
            )
        arrays.append(np.frombuffer(raw, numpy_dtype(dtype_from_name(d))).reshape(s))
    return WeightsSnapshot(w.version, w.names, w.dtypes, tuple(arrays), w.checksums)
