"""A worker's side of same-host weights: reading the learner's segments in place.

Each worker copies every tensor from its mapping of a segment into its policy, computing the
CRC32C of what it copied on the way.  A worker that cannot open the file, or finds another
nonce in it (it runs on another machine, as another user or in another container), raises
:class:`~daskrl.WeightsNotSharedError`, and the collector sends weights through Dask from then
on.  A checksum mismatch is an integrity error only when the segment did not change under the
read.  The same reader reads the per-host copies of :mod:`daskrl.weights._host_copies`.
"""

from __future__ import annotations

import collections
import mmap
import os
import warnings

import numpy as np
import torch

from daskrl._checksums import crc32c
from daskrl.errors import PolicyError, WeightsIntegrityError, WeightsNotSharedError
from daskrl.weights._segments import HEADER, MAGIC, SharedWeights, tensor_nbytes
from daskrl.weights._snapshot import (
    WeightsSnapshot,
    as_numpy,
    copy_with_crc,
    dtype_from_name,
    get_tensor,
    numpy_dtype,
)

__all__ = ["SharedWeightsReader", "own_file"]

_HINT = (". The collector's iteration and update_weights(wait=True) switch to Dask transfers on "
         "this error; a submit() future fails with it (pass shared_memory=False when workers "
         "join from other machines and you drive the collector with submit()).")


class SharedWeightsReader:
    """A worker's side: mappings of the learner's segments, kept open across versions (a
    reused segment is then not faulted in again)."""

    def __init__(self, max_open: int = 4) -> None:
        self.max_open = max_open
        self._maps: collections.OrderedDict[str, mmap.mmap] = collections.OrderedDict()

    def _map(self, w: SharedWeights, where: str) -> mmap.mmap:
        mm = self._maps.get(w.path)
        if mm is not None and HEADER.unpack_from(mm, 0)[1] == w.nonce:
            self._maps.move_to_end(w.path)
            return mm
        self._drop(w.path)
        try:
            fd = os.open(w.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        except OSError as e:
            raise WeightsNotSharedError(
                f"{where} cannot open the learner's shared-memory weights {w.path!r} "
                f"(learner on {w.host!r}): {e}{_HINT}"
            ) from None
        try:
            if not own_file(fd):
                raise WeightsNotSharedError(
                    f"{where}: {w.path!r} belongs to another user than this worker's{_HINT}")
            size = os.fstat(fd).st_size
            need = w.offsets[-1] + tensor_nbytes(w.dtypes[-1], w.shapes[-1]) if w.names else 0
            if size < max(need, HEADER.size):
                raise WeightsNotSharedError(
                    f"{where}: {w.path!r} is not the learner's weights (learner on "
                    f"{w.host!r}){_HINT}"
                )
            mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        magic, nonce, _ = HEADER.unpack_from(mm, 0)
        if magic != MAGIC or nonce != w.nonce:
            mm.close()
            raise WeightsNotSharedError(
                f"{where}: {w.path!r} here is another file than the learner's on {w.host!r} "
                f"(another machine or container){_HINT}"
            )
        self._maps[w.path] = mm
        while len(self._maps) > self.max_open:
            self._drop(next(iter(self._maps)))
        return mm

    def _drop(self, path: str) -> None:
        mm = self._maps.pop(path, None)
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass

    def load(self, module: torch.nn.Module, w: SharedWeights, where: str = "worker") -> None:
        """Copy version ``w`` into ``module`` in place, verifying each tensor's checksum.

        Raises :class:`~daskrl.WeightsNotSharedError` if the segment cannot be read here or
        changed under the read (the module may then hold a mix: load another version before
        using it), :class:`~daskrl.WeightsIntegrityError` if bytes differ from the learner's.
        """
        mm = self._map(w, where)

        def changed() -> bool:
            return HEADER.unpack_from(mm, 0)[2] != w.version

        if changed():
            raise WeightsNotSharedError(
                f"{where}: weights version {w.version} was replaced in shared memory before "
                "it could be read"
            )
        with torch.no_grad():
            for name, dtype, shape, off, expected in zip(w.names, w.dtypes, w.shapes, w.offsets,
                                                         w.checksums):
                dst = get_tensor(module, name)
                td = dtype_from_name(dtype)
                if tuple(dst.shape) != shape or dst.dtype != td:
                    raise PolicyError(
                        f"weights version {w.version}: tensor {name!r} is {shape} {td}, but "
                        f"the worker's policy has {tuple(dst.shape)} {dst.dtype}. The policy's "
                        "structure changed after the collector started; make a new Collector "
                        "for a new architecture."
                    )
                if dst.numel() == 0:
                    continue
                src = np.frombuffer(mm, np.uint8, tensor_nbytes(dtype, shape), off)
                if dst.device.type == "cpu" and dst.is_contiguous():
                    got = copy_with_crc(as_numpy(dst.detach()), src)
                else:
                    got = int(crc32c(src))
                    with warnings.catch_warnings():  # read-only source: only read from
                        warnings.simplefilter("ignore", UserWarning)
                        host = torch.frombuffer(mm, dtype=td, count=int(np.prod(shape)),
                                                offset=off)
                    dst.copy_(host.view(shape))
                if got != expected:
                    if changed():
                        raise WeightsNotSharedError(
                            f"{where}: weights version {w.version} was replaced in shared "
                            "memory while it was read"
                        )
                    raise WeightsIntegrityError(
                        f"weights version {w.version}: tensor {name!r} read from shared memory "
                        f"has checksum {got:#010x}, the learner computed {expected:#010x}. "
                        "Something other than daskrl wrote to "
                        f"{w.path!r}; call update_weights() again."
                    )
        if changed():
            raise WeightsNotSharedError(
                f"{where}: weights version {w.version} was replaced in shared memory while it "
                "was read"
            )

    def snapshot(self, w: SharedWeights, where: str = "worker") -> WeightsSnapshot:
        """Version ``w`` as a snapshot of read-only views of its mapping, not copied and not
        checked (whoever loads it checks the learner's checksums): to serve it to another
        host. The mapping lives as long as the arrays."""
        mm = self._map(w, where)
        arrays = tuple(
            np.frombuffer(mm, numpy_dtype(dtype_from_name(d)), int(np.prod(s, dtype=np.int64)),
                          off).reshape(s)
            for d, s, off in zip(w.dtypes, w.shapes, w.offsets))
        return WeightsSnapshot(version=w.version, names=w.names, dtypes=w.dtypes,
                               arrays=arrays, checksums=w.checksums)

    def close(self) -> None:
        """Drop every mapping."""
        for path in list(self._maps):
            self._drop(path)


def own_file(fd: int) -> bool:
    """Whether the open file belongs to this process's user (POSIX; elsewhere: True)."""
    return not hasattr(os, "geteuid") or os.fstat(fd).st_uid == os.geteuid()
