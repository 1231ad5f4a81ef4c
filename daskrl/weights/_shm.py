"""Same-host weights: one shared-memory copy of each version, read in place by local workers.

Sending a version through Dask costs every worker a serialization, a socket transfer (TLS
included) and a checksum pass over the whole state: 10-25x a ``memcpy`` for a 100 MB policy
(``benchmarks/bench_weights.py``).  Workers on the learner's machine need none of it: the
learner takes its snapshot straight into a file in shared memory (``/dev/shm``; the temp
directory where there is none), and each worker copies every tensor from its mapping of that
file into its policy, computing the CRC32C of what it copied on the way.  Only a small
:class:`SharedWeights` manifest (names, dtypes, shapes, offsets, checksums, the file's path and a
random nonce) travels through Dask.

A worker that cannot open the file, or finds another nonce in it (it runs on another machine,
as another user or in another container), raises :class:`~daskrl.WeightsNotSharedError`, and
the collector sends weights through Dask from then on.

Segments are reused across versions, since a fresh 100 MB mapping costs more in page faults
than the copy.  The learner reuses a segment only once no batch needs its version; the header's
version is -1 while it is rewritten, so a worker that raced a rewrite reports the weights as
not shared rather than loading a mix (and a checksum mismatch is an integrity error only when
the segment did not change under the read).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import mmap
import os
import re
import secrets
import socket
import struct
import tempfile
import time
import warnings
from collections.abc import Sequence

import numpy as np
import torch

from daskrl._checksums import crc32c
from daskrl.errors import PolicyError, WeightsIntegrityError, WeightsNotSharedError
from daskrl.weights._snapshot import (
    WeightsSnapshot,
    as_numpy,
    copy_with_crc,
    dtype_from_name,
    get_tensor,
    numpy_dtype,
    snapshot,
)

__all__ = ["HostCopies", "Segment", "SegmentPool", "SharedWeights", "SharedWeightsReader", "shared_memory_dir"]

logger = logging.getLogger(__name__)

_MAGIC = b"DASKRLW1"
_HEADER = struct.Struct("<8s16sq")  # magic, nonce, version (-1 while being written)
_DATA_START = 64
_ALIGN = 64
_PREFIX = "daskrl-weights-"
_NAME = re.compile(rf"{_PREFIX}(\d+)-[0-9a-f]+$")

_HINT = (". The collector's iteration and update_weights(wait=True) switch to Dask transfers on "
         "this error; a submit() future fails with it (pass shared_memory=False when workers "
         "join from other machines and you drive the collector with submit()).")

Layout = Sequence[tuple[str, str, tuple[int, ...]]]
"""``(name, torch dtype, shape)`` per tensor, as :func:`daskrl.weights.weights_layout` gives."""


@dataclasses.dataclass(frozen=True)
class SharedWeights:
    """What travels through Dask for a version held in shared memory: where each tensor is."""

    version: int
    names: tuple[str, ...]
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    checksums: tuple[int, ...]
    """CRC32C of each tensor's bytes, computed by the learner as it took the snapshot."""
    path: str
    nonce: bytes
    """Random bytes at the head of the file: a same-named file elsewhere does not have them."""
    host: str
    """The learner's host name (for messages)."""

    @property
    def nbytes(self) -> int:
        """Bytes of weight data in this version."""
        return sum(_nbytes(d, s) for d, s in zip(self.dtypes, self.shapes))


def _nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64)) * dtype_from_name(dtype).itemsize


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
        offsets, end = [], _DATA_START
        for _, dtype, shape in self.layout:
            offsets.append(end)
            end += -(-_nbytes(dtype, shape) // _ALIGN) * _ALIGN
        self.offsets = tuple(offsets)
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
        _HEADER.pack_into(self._mm, 0, _MAGIC, self.nonce, -1)
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
        _HEADER.pack_into(self._mm, 0, _MAGIC, self.nonce, -1)

    def finish(self, snap: WeightsSnapshot) -> SharedWeights:
        """Mark ``snap`` (taken into :attr:`arrays`) as the segment's content; its manifest."""
        assert self._mm is not None
        layout = tuple((n, d, tuple(a.shape)) for n, d, a in zip(snap.names, snap.dtypes,
                                                                 snap.arrays))
        if layout != self.layout or not all(
            a is self.arrays[n] or np.shares_memory(a, self.arrays[n])
            for n, a in zip(snap.names, snap.arrays)
        ):
            raise RuntimeError("daskrl internal error: the snapshot is not in its segment")
        _HEADER.pack_into(self._mm, 0, _MAGIC, self.nonce, snap.version)
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


class SharedWeightsReader:
    """A worker's side: mappings of the learner's segments, kept open across versions (a
    reused segment is then not faulted in again)."""

    def __init__(self, max_open: int = 4) -> None:
        self.max_open = max_open
        self._maps: collections.OrderedDict[str, mmap.mmap] = collections.OrderedDict()

    def _map(self, w: SharedWeights, where: str) -> mmap.mmap:
        mm = self._maps.get(w.path)
        if mm is not None and _HEADER.unpack_from(mm, 0)[1] == w.nonce:
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
            if not _own_file(fd):
                raise WeightsNotSharedError(
                    f"{where}: {w.path!r} belongs to another user than this worker's{_HINT}")
            size = os.fstat(fd).st_size
            need = w.offsets[-1] + _nbytes(w.dtypes[-1], w.shapes[-1]) if w.names else 0
            if size < max(need, _HEADER.size):
                raise WeightsNotSharedError(
                    f"{where}: {w.path!r} is not the learner's weights (learner on "
                    f"{w.host!r}){_HINT}"
                )
            mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        magic, nonce, _ = _HEADER.unpack_from(mm, 0)
        if magic != _MAGIC or nonce != w.nonce:
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
            return _HEADER.unpack_from(mm, 0)[2] != w.version

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
                src = np.frombuffer(mm, np.uint8, _nbytes(dtype, shape), off)
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

    def close(self) -> None:
        """Drop every mapping."""
        for path in list(self._maps):
            self._drop(path)


class HostCopies:
    """A worker's side of the per-host copy: workers of one host share one copy of each
    version received through Dask.

    The first worker of a host to need a version takes a lock file in shared memory, fetches
    the version through Dask, verifies it, copies it into a segment of its own and writes the
    segment's manifest (the learner's checksums) next to it; the host's other workers wait
    for that manifest (a bounded wait: a lock whose holder died is ignored) and read the
    segment like the learner's shared memory, checking every tensor against the learner's
    checksums. Nothing is trusted that the checksums do not cover. Each worker removes the
    copies it made, keeping the newest ``keep``.
    """

    WAIT_S = 30.0

    def __init__(self, name: str, keep: int = 3, directory: str | None = None) -> None:
        self.name = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        self.keep = keep
        self.directory = directory or shared_memory_dir()
        self._own: collections.OrderedDict[str, Segment] = collections.OrderedDict()

    def _path(self, key: str, suffix: str) -> str:
        return os.path.join(self.directory, f"daskrl-host-{self.name}-{key}{suffix}")

    def manifest(self, key: str, wait: bool) -> SharedWeights | None:
        """The host's copy of ``key`` if there is one; with ``wait``, first wait (bounded) for
        a copy another worker of this host is making."""
        path, lock = self._path(key, ".json"), self._path(key, ".lock")
        deadline = time.monotonic() + self.WAIT_S
        while True:
            try:
                with open(path, encoding="utf-8") as f:
                    if not _own_file(f.fileno()):
                        return None  # another user's: not ours to trust
                    doc = json.load(f)
                return SharedWeights(
                    version=int(doc["version"]), names=tuple(doc["names"]),
                    dtypes=tuple(doc["dtypes"]),
                    shapes=tuple(tuple(int(n) for n in s) for s in doc["shapes"]),
                    offsets=tuple(int(o) for o in doc["offsets"]),
                    checksums=tuple(int(c) for c in doc["checksums"]), path=str(doc["path"]),
                    nonce=bytes.fromhex(doc["nonce"]), host=str(doc["host"]))
            except (OSError, ValueError, KeyError, TypeError):
                pass
            if not wait or time.monotonic() > deadline or not _lock_held(lock):
                return None
            time.sleep(0.02)

    def claim(self, key: str) -> bool:
        """Become the worker that makes the host's copy of ``key`` (False: another is)."""
        lock = self._path(key, ".lock")
        try:
            fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            if _lock_held(lock):
                return False
            with contextlib.suppress(OSError):
                os.unlink(lock)  # its holder died
            return self.claim(key)
        except OSError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True

    def release(self, key: str) -> None:
        """Give up a claim without making the copy."""
        with contextlib.suppress(OSError):
            os.unlink(self._path(key, ".lock"))

    def publish(self, key: str, snap: WeightsSnapshot) -> None:
        """Copy ``snap`` (verified) into a segment and make it the host's copy of ``key``;
        the lock is released in any case."""
        try:
            layout = [(n, d, tuple(a.shape)) for n, d, a in zip(snap.names, snap.dtypes,
                                                                  snap.arrays)]
            segment = Segment.create(layout, self.directory)  # sweeps dead workers' segments
            if segment is None:
                return
            self._sweep_orphans()
            for (name, *_), arr, expected in zip(layout, snap.arrays, snap.checksums):
                if copy_with_crc(segment.arrays[name], arr) != expected:
                    segment.close()
                    return  # the caller's verify() reports the mismatch
            manifest = segment.finish(dataclasses.replace(
                snap, arrays=tuple(segment.arrays[n] for n in snap.names)))
            doc = dataclasses.asdict(manifest)
            doc["nonce"] = manifest.nonce.hex()
            tmp = self._path(key, f".json.{os.getpid()}")
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(doc, f)
            os.replace(tmp, self._path(key, ".json"))
            self._own[key] = segment
            while len(self._own) > self.keep:
                self._remove(*self._own.popitem(last=False))
        finally:
            self.release(key)

    def _sweep_orphans(self) -> None:
        """Remove manifests whose segment is gone and locks whose holder died (left by
        workers that were killed: they never closed their copies)."""
        try:
            names = [n for n in os.listdir(self.directory) if n.startswith("daskrl-host-")]
        except OSError:
            return
        for name in names:
            path = os.path.join(self.directory, name)
            try:
                if name.endswith(".lock"):
                    if not _lock_held(path):
                        os.unlink(path)
                elif name.endswith(".json"):
                    with open(path, encoding="utf-8") as f:
                        if not _own_file(f.fileno()):
                            continue
                        target = json.load(f).get("path", "")
                    if not os.path.exists(target):
                        os.unlink(path)
            except (OSError, ValueError, AttributeError):
                continue

    def _remove(self, key: str, segment: Segment) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self._path(key, ".json"))
        segment.close()

    def close(self) -> None:
        """Remove every copy this worker made."""
        while self._own:
            self._remove(*self._own.popitem(last=False))


def _own_file(fd: int) -> bool:
    """Whether the open file belongs to this process's user (POSIX; elsewhere: True)."""
    return not hasattr(os, "geteuid") or os.fstat(fd).st_uid == os.geteuid()


def _lock_held(path: str) -> bool:
    """Whether ``path`` exists and names a live process (of this host)."""
    try:
        with open(path, encoding="utf-8") as f:
            pid = int(f.read() or 0)
    except (OSError, ValueError):
        return os.path.exists(path)  # being written: held
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
