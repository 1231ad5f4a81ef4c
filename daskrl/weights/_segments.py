"""The learner's side of same-host weights: one shared-memory file (a segment) per version.

Sending a version through Dask costs every worker a serialization, a socket transfer (TLS
included) and a checksum pass over the whole state: 10-25x a ``memcpy`` for a 100 MB policy
(``benchmarks/bench_weights.py``).  Workers on the learner's machine need none of it: the
learner takes its snapshot straight into a file in shared memory (``/dev/shm``; the temp
directory where there is none), and only a small :class:`SharedWeights` manifest (names,
dtypes, shapes, offsets, checksums, the file's path and a random nonce) travels through Dask.
Workers read the file with :class:`~daskrl.weights._shared_reader.SharedWeightsReader`.

Segments are reused across versions, since a fresh 100 MB mapping costs more in page faults
than the copy.  The learner reuses a segment only once no batch needs its version; the header's
version is -1 while it is rewritten, so a worker that raced a rewrite reports the weights as
not shared rather than loading a mix.

This module owns the file format (:data:`HEADER`, :data:`MAGIC`, :data:`DATA_START`), the
learner's :class:`Segment` and :class:`SegmentPool`, and the sweep of dead learners' files.
"""

from __future__ import annotations

import dataclasses
import logging
import mmap
import os
import re
import secrets
import socket
import struct
import tempfile
from collections.abc import Sequence

import numpy as np
import torch

from daskrl.errors import InternalError
from daskrl.weights._snapshot import WeightsSnapshot, dtype_from_name, numpy_dtype, snapshot

__all__ = [
    "DATA_START", "HEADER", "MAGIC", "Layout", "Segment", "SegmentPool", "SharedWeights",
    "TensorManifest", "shared_memory_dir", "tensor_nbytes", "tensor_offsets",
]

logger = logging.getLogger(__name__)

MAGIC = b"DASKRLW1"
HEADER = struct.Struct("<8s16sq")
"""The head of every segment: magic, nonce, version (-1 while the segment is rewritten)."""
DATA_START = 64
_ALIGN = 64
_PREFIX = "daskrl-weights-"
_NAME = re.compile(rf"{_PREFIX}(\d+)-[0-9a-f]+$")

Layout = Sequence[tuple[str, str, tuple[int, ...]]]
"""``(name, torch dtype, shape)`` per tensor, as :func:`daskrl.weights.weights_layout` gives."""


@dataclasses.dataclass(frozen=True)
class TensorManifest:
    """Where each tensor of a version is in a file of segment format (:data:`HEADER`, then
    the tensors at ``offsets``), and the learner's checksums of them."""

    version: int
    names: tuple[str, ...]
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    checksums: tuple[int, ...]
    """CRC32C of each tensor's bytes, computed by the learner as it took the snapshot."""

    @property
    def nbytes(self) -> int:
        """Bytes of weight data in this version."""
        return sum(tensor_nbytes(d, s) for d, s in zip(self.dtypes, self.shapes))


@dataclasses.dataclass(frozen=True)
class SharedWeights(TensorManifest):
    """What travels through Dask for a version held in shared memory: where each tensor is."""

    path: str
    nonce: bytes
    """Random bytes at the head of the file: a same-named file elsewhere does not have them."""
    host: str
    """The learner's host name (for messages)."""


def tensor_nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor of torch dtype ``dtype`` (by name) and ``shape``."""
    return int(np.prod(shape, dtype=np.int64)) * dtype_from_name(dtype).itemsize


def tensor_offsets(layout: Layout) -> tuple[tuple[int, ...], int]:
    """Where each tensor of ``layout`` starts in a segment (aligned, after the header), and
    the segment's size."""
    offsets, end = [], DATA_START
    for _, dtype, shape in layout:
        offsets.append(end)
        end += -(-tensor_nbytes(dtype, tuple(shape)) // _ALIGN) * _ALIGN
    return tuple(offsets), end


def shared_memory_dir() -> str:
    """Where segments are created: ``/dev/shm`` (memory) if writable, else the temp dir."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK):
        return "/dev/shm"
    return tempfile.gettempdir()


def _sweep_stale(directory: str) -> None:
    """Remove segments left by learners of this machine that died without closing them."""
    if os.name != "posix":
        return
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        m = _NAME.match(name)
        if not m or int(m.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:  # its learner is gone
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass
        except OSError:  # alive (as another user)
            pass


class Segment:
    """The learner's side: one file in shared memory holding the arrays of a version."""

    def __init__(self, layout: Layout, directory: str | None = None) -> None:
        self.layout = tuple((n, d, tuple(s)) for n, d, s in layout)
        self.offsets, end = tensor_offsets(self.layout)
        directory = directory or shared_memory_dir()
        _sweep_stale(directory)
        self.path = os.path.join(directory, f"{_PREFIX}{os.getpid()}-{secrets.token_hex(8)}")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0),
                     0o600)
        try:
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, end)  # no space fails now, not as a SIGBUS later
            else:
                os.ftruncate(fd, end)
            self._mm: mmap.mmap | None = mmap.mmap(fd, end)
        except BaseException:
            os.unlink(self.path)
            raise
        finally:
            os.close(fd)
        self.nonce = secrets.token_bytes(16)
        HEADER.pack_into(self._mm, 0, MAGIC, self.nonce, -1)
        self.arrays = {
            name: np.frombuffer(self._mm, numpy_dtype(dtype_from_name(dtype)),
                                int(np.prod(shape, dtype=np.int64)), off).reshape(shape)
            for (name, dtype, shape), off in zip(self.layout, self.offsets)
        }

    @classmethod
    def create(cls, layout: Layout, directory: str | None = None) -> Segment | None:
        """A new segment, or None (logged) where shared memory cannot hold it."""
        try:
            return cls(layout, directory)
        except OSError as e:
            logger.info("weights go through Dask: no shared-memory segment (%s)", e)
            return None

    def begin(self) -> None:
        """Mark the segment as being rewritten (readers racing the rewrite see it)."""
        assert self._mm is not None
        HEADER.pack_into(self._mm, 0, MAGIC, self.nonce, -1)

    def finish(self, snap: WeightsSnapshot) -> SharedWeights:
        """Mark ``snap`` (taken into :attr:`arrays`) as the segment's content; its manifest."""
        assert self._mm is not None
        layout = tuple((n, d, tuple(a.shape)) for n, d, a in zip(snap.names, snap.dtypes,
                                                                 snap.arrays))
        if layout != self.layout or not all(
            a is self.arrays[n] or np.shares_memory(a, self.arrays[n])
            for n, a in zip(snap.names, snap.arrays)
        ):
            raise InternalError("daskrl internal error: the snapshot is not in its segment")
        HEADER.pack_into(self._mm, 0, MAGIC, self.nonce, snap.version)
        return SharedWeights(
            version=snap.version,
            names=snap.names,
            dtypes=snap.dtypes,
            shapes=tuple(tuple(a.shape) for a in snap.arrays),
            offsets=self.offsets,
            checksums=snap.checksums,
            path=self.path,
            nonce=self.nonce,
            host=socket.gethostname(),
        )

    def close(self) -> None:
        """Remove the file (workers' mappings stay valid until they drop them)."""
        try:
            os.unlink(self.path)
        except OSError:
            pass
        mm, self._mm = self._mm, None
        self.arrays = {}
        if mm is not None:
            try:
                mm.close()
            except BufferError:  # a snapshot still views it; freed with that snapshot
                pass


class SegmentPool:
    """The learner's segments: one per published version, and one spare to reuse."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        """Whether new versions go to shared memory (off once a worker could not read one)."""
        self._versions: dict[int, tuple[Segment, SharedWeights]] = {}
        self._spare: Segment | None = None

    def write(self, module: torch.nn.Module, version: int,
              layout: Layout) -> tuple[WeightsSnapshot, SharedWeights] | None:
        """Snapshot ``module`` into a segment; None (take a plain snapshot) when disabled or
        when shared memory cannot hold it (sharing is then disabled)."""
        if not self.enabled:
            return None
        segment, self._spare = self._spare, None
        if segment is None or segment.layout != tuple(layout):
            if segment is not None:
                segment.close()
            segment = Segment.create(layout)
            if segment is None:
                self.enabled = False
                return None
        segment.begin()
        try:
            snap = snapshot(module, version, out=segment.arrays)
            manifest = segment.finish(snap)
        except BaseException:
            segment.close()
            raise
        self._versions[version] = (segment, manifest)
        return snap, manifest

    def manifest(self, version: int) -> SharedWeights | None:
        """The manifest of ``version`` if it is in shared memory."""
        entry = self._versions.get(version)
        return entry[1] if entry else None

    def release(self, version: int) -> None:
        """Nobody needs ``version`` any more: keep its segment as the spare, or remove it."""
        entry = self._versions.pop(version, None)
        if entry is None:
            return
        if self._spare is None:
            self._spare = entry[0]
        else:
            entry[0].close()

    def close(self) -> None:
        """Remove every segment."""
        for segment, _ in self._versions.values():
            segment.close()
        self._versions.clear()
        if self._spare is not None:
            self._spare.close()
            self._spare = None
