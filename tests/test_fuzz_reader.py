"""Fuzz test of the container and metadata reader: real stores, mutated (bytes flipped, files
truncated, size and header fields changed, JSON values replaced), then read on disk and through
fsspec (``memory://``).  Reading must return the right data or raise a DaskrlError; never
another exception, never a crash, a hang or an unbounded allocation.

Hypothesis runs in a child process under a memory limit and a timeout (a crash or a hang must
fail the test, not end the test run), seeded (``derandomize=True``) and bounded: the same
examples every run, a few seconds per target in the unit tier.  ``DASKRL_FUZZ_EXAMPLES`` sets
the number of examples per target (default 12; e.g. 500 for a longer hunt).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = int(os.environ.get("DASKRL_FUZZ_EXAMPLES", "12"))
MEMORY_LIMIT = 3 << 30
"""Address space a child may allocate (RLIMIT_DATA): far more than any example needs."""


@pytest.mark.timeout(600)
@pytest.mark.parametrize("target", ["container", "member", "record"])
def test_fuzzed_stores_read_correctly_or_raise_a_daskrl_error(target):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(ROOT / "tests")])}
    code = (f"import resource; resource.setrlimit(resource.RLIMIT_DATA, ({MEMORY_LIMIT}, "
            f"{MEMORY_LIMIT})); import test_fuzz_reader as f; f.run({target!r}, {EXAMPLES})")
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=540, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the fuzzed reader hung (no result in {e.timeout}s): {e.stdout!s:.3000}")
    out = (r.stdout + r.stderr)[-6000:]
    crash = f", a crash: signal {-r.returncode}" if r.returncode < 0 else ""
    assert r.returncode == 0, f"the fuzzed reader failed (exit {r.returncode}{crash}):\n{out}"
    assert f"fuzzed {EXAMPLES} examples" in r.stdout, out


# -- the child: build real stores, mutate, read -------------------------------------------------
def _originals(base: Path) -> tuple[Path, dict[int, dict[str, np.ndarray]]]:
    """A store of three batches (zstd, lz4, none), arrays of several chunks with a padded edge
    chunk, written by daskrl; and the arrays of each batch."""
    from sample_batches import sample_meta

    from daskrl.config import Compression
    from daskrl.store import TrajectoryStore
    from daskrl.store._format import encode_batch
    root = base / "orig"
    w = TrajectoryStore(str(root), read_only=False)
    w.initialize()
    w.register_run({"reset_at_each_iter": False})
    rng = np.random.default_rng(0)
    batches = {}
    for bid, comp in enumerate(["zstd", "lz4", "none"]):
        T, E = 37, 3
        arrays = {
            "observation": rng.standard_normal((T, E, 5)).astype(np.float32),
            "action": rng.integers(0, 4, (T, E)).astype(np.int64),
            "terminated": rng.random((T, E)) < 0.2,
            "step": np.arange(T * E, dtype=np.int16).reshape(T, E),
            "episode_id": np.broadcast_to(np.arange(E) + (bid << 24), (T, E)).astype(np.int64),
            "truncated": np.zeros((T, E), bool),
        }
        path, _ = w.write_batch(bid, arrays, sample_meta(T, E), compression=comp)
        # the same batch in chunks of 1 KiB: several per array, the last one padded
        small = encode_batch({**sample_meta(T, E), "batch_id": bid, "path": path}, arrays,
                             Compression(comp), chunk_bytes=1024)
        (root / path).write_bytes(b"".join(bytes(memoryview(p).cast("B"))
                                           for p in small.parts()))
        batches[bid] = arrays
    return root, batches


_INTERESTING = [0, 1, 2, 3, 4, 15, 16, 17, 255, 256, 0x7FFF, 0xFFFF, 0x10000, 0x7FFFFFFF,
                0x80000000, 0xFFFFFFFF, 0xFFFFFFFE]


def _mutate_bytes(data: bytes, ops: list[tuple[str, int, int]]) -> bytes:
    """Apply ``(kind, position, value)`` operations: flip a byte, truncate, set a 16- or 32-bit
    little-endian field (a size, an offset, a count) to an interesting value, insert or delete
    bytes."""
    buf = bytearray(data)
    for kind, pos, value in ops:
        if not buf:
            break
        p = pos % len(buf)
        if kind == "flip":
            buf[p] ^= (value % 255) + 1
        elif kind == "truncate":
            del buf[p:]
        elif kind == "u32" and p + 4 <= len(buf):
            struct.pack_into("<I", buf, p, _INTERESTING[value % len(_INTERESTING)])
        elif kind == "u16" and p + 2 <= len(buf):
            struct.pack_into("<H", buf, p, _INTERESTING[value % len(_INTERESTING)] & 0xFFFF)
        elif kind == "insert":
            buf[p:p] = bytes([value % 256]) * (1 + value % 7)
        elif kind == "delete":
            del buf[p:p + 1 + value % 7]
    return bytes(buf)


def _json_replace(doc, path: list[int], value):
    """``doc`` with the value reached by following ``path`` (indices into the keys or items at
    each level) replaced by ``value``."""
    if not path or not isinstance(doc, (dict, list)) or not doc:
        return value
    if isinstance(doc, dict):
        key = sorted(doc)[path[0] % len(doc)]
        return {**doc, key: _json_replace(doc[key], path[1:], value)}
    i = path[0] % len(doc)
    return [*doc[:i], _json_replace(doc[i], path[1:], value), *doc[i + 1:]]


def _limits():
    """The reader's bounds as in production, but a smaller free allowance so that examples
    that declare huge arrays of absent chunks stay quick."""
    from daskrl.store import ReadLimits

    return ReadLimits(free_bytes=16 << 20)


_LIMITS = None


def _check_read(url: str, batches: dict[int, dict[str, np.ndarray]], exact: bool) -> None:
    """Everything a learner reads from a store; only DaskrlErrors may come out.  With
    ``exact``, whatever loads must equal what was written (the mutation could only damage, not
    forge, e.g. a flipped byte under a checksum)."""
    import warnings

    import daskrl
    import daskrl.data
    from daskrl.data._inspect import summarize

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", daskrl.StoreRecordWarning)
        try:
            store = daskrl.open_store(url, read_limits=_LIMITS)
        except daskrl.DaskrlError:
            return
        for call in (store.batch_ids, store.runs, store.skipped_records, lambda: store.frames,
                     lambda: summarize(store), lambda: list(daskrl.data.episodes(store, complete_only=False))):
            try:
                call()
            except daskrl.DaskrlError:
                pass
        for bid in range(4):
            try:
                got = store.load(bid)
            except daskrl.DaskrlError:
                continue
            again = store.load(bid)  # decoding is deterministic (no stray memory in the data)
            assert got.keys() == again.keys()
            for k in got:
                assert got[k].numpy().tobytes() == again[k].numpy().tobytes(), k
            if exact:
                want = batches[bid]
                assert sorted(got) == sorted(want), (bid, sorted(got))
                for k, v in want.items():
                    np.testing.assert_array_equal(got[k].numpy(), v, err_msg=f"{bid}/{k}")


def _check_remote(root: Path, n: int, batches: dict[int, dict[str, np.ndarray]],
                  exact: bool) -> None:
    """:func:`_check_read` of the store copied into fsspec's memory filesystem (read through
    suffix and range requests, as from S3)."""
    import fsspec

    fs = fsspec.filesystem("memory")
    url = f"memory://fuzz-{n}"
    for f in root.rglob("*"):
        if f.is_file() and not f.is_symlink():
            fs.pipe_file(f"{url}/{f.relative_to(root).as_posix()}", f.read_bytes())
    try:
        _check_read(url, batches, exact)
    finally:
        fs.rm(url, recursive=True)


def run(target: str, examples: int) -> None:
    """Fuzz ``target``: ``container`` (the zip file's bytes), ``member`` (one member's content,
    the container rewritten with valid zip CRC-32s, chunks re-checksummed as a forger would),
    ``record`` (commit, run and root records)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from daskrl._checksums import crc32c
    global _LIMITS
    _LIMITS = _limits()
    base = Path(tempfile.mkdtemp(prefix="daskrl-fuzz-"))
    orig, batches = _originals(base)
    containers = sorted((orig / "batches").glob("*.zip"))
    records = sorted(str(p.relative_to(orig)) for p in orig.rglob("zarr.json")
                     if p.parent.name != "batches" and "batches" not in p.parts)
    ops = st.lists(st.tuples(st.sampled_from(["flip", "truncate", "u32", "u16", "insert",
                                              "delete", "flip", "u32"]),
                             st.integers(0, 1 << 20), st.integers(0, 1 << 16)),
                   min_size=1, max_size=4)
    json_values = st.recursive(
        st.none() | st.booleans() | st.integers(-(1 << 40), 1 << 40)
        | st.sampled_from(_INTERESTING) | st.floats() | st.text(max_size=8)
        | st.sampled_from(["../x.zip", "/etc/passwd", "batches/000000000000-a.zip", "NaN",
                           "blosc", "zstd", "gzip", "crc32c", "bytes", "uint8", "|O"]),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                    max_size=3),
        max_leaves=6)
    counter = iter(range(1 << 30))

    def fresh() -> Path:
        root = base / f"s{next(counter)}"
        shutil.copytree(orig, root)
        return root

    def read_both(root: Path, exact: bool) -> None:
        _check_read(str(root), batches, exact)
        _check_remote(root, next(counter), batches, exact)
        shutil.rmtree(root)

    config = settings(max_examples=examples, derandomize=True, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck), print_blob=True)

    if target == "container":
        @config
        @given(st.integers(0, len(containers) - 1), ops,
               st.sampled_from(["anywhere", "tail", "head"]))
        def fuzz(which: int, mutations: list, where: str) -> None:
            root = fresh()
            path = root / containers[which].relative_to(orig)
            data = path.read_bytes()
            if where != "anywhere":  # aim at the directory and end records, or the first headers
                span = min(len(data), 600)
                offset = len(data) - span if where == "tail" else 0
                mutations = [(k, offset + p % span, v) for k, p, v in mutations]
            path.write_bytes(_mutate_bytes(data, mutations))
            read_both(root, exact=True)
    elif target == "member":
        @config
        @given(st.integers(0, len(containers) - 1), st.integers(0, 1 << 10), ops,
               st.lists(st.integers(0, 64), min_size=1, max_size=4), json_values,
               st.booleans(), st.booleans())
        def fuzz(which: int, member: int, mutations: list, jpath: list, value, as_json: bool,
                 head: bool) -> None:
            root = fresh()
            path = root / containers[which].relative_to(orig)
            with zipfile.ZipFile(path) as z:
                members = {n: z.read(n) for n in z.namelist()}
            name = sorted(members)[member % len(members)]
            data = members[name]
            if name.endswith("zarr.json") and as_json:
                members[name] = json.dumps(_json_replace(json.loads(data), jpath, value)).encode()
            else:
                if head:  # aim at a codec's header (blosc: 16 bytes, then block offsets)
                    mutations = [(k, p % 40, v) for k, p, v in mutations]
                new = _mutate_bytes(data, mutations)
                if not name.endswith("zarr.json") and len(new) > 4:  # forge the crc32c too
                    new = new[:-4] + crc32c(new[:-4]).to_bytes(4, "little")
                members[name] = new
            path.unlink()
            with zipfile.ZipFile(path, "w") as z:
                for n, d in members.items():
                    z.writestr(n, d)
            read_both(root, exact=False)
    else:
        @config
        @given(st.integers(0, len(records) - 1), ops, st.lists(st.integers(0, 64), min_size=1,
                                                              max_size=4), json_values,
               st.booleans())
        def fuzz(which: int, mutations: list, jpath: list, value, as_json: bool) -> None:
            root = fresh()
            path = root / records[which]
            data = path.read_bytes()
            if as_json:
                new = json.dumps(_json_replace(json.loads(data), jpath, value)).encode()
            else:
                new = _mutate_bytes(data, mutations)
            path.unlink()
            path.write_bytes(new)
            # a record can only name its own batch's container: what loads is that batch
            read_both(root, exact=True)

    try:
        fuzz()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"fuzzed {examples} examples of {target}")
