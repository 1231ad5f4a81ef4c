"""The per-host copy of Dask-sent weights: workers of one host share one copy per version.

Weights that reach a host through Dask (its workers do not share the learner's memory) are
fetched once per host, not once per worker: the first worker to need a version makes a
segment of it in this host's shared memory, the others read that segment, every tensor checked
against the learner's checksums.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import re
import time

from daskrl.weights._segments import Segment, SharedWeights, shared_memory_dir
from daskrl.weights._shared_reader import own_file
from daskrl.weights._snapshot import WeightsSnapshot, copy_with_crc

__all__ = ["HostCopies"]


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
                    if not own_file(f.fileno()):
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
        """Become the worker that makes the host's copy of ``key`` (False: another is, or
        made it since the caller last looked: a worker that found no copy and then claims
        after the maker released its lock finds the copy, and fetches nothing)."""
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
        made = self.manifest(key, wait=False)
        if made is not None and os.path.exists(made.path):
            self.release(key)
            return False
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
                        if not own_file(f.fileno()):
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
