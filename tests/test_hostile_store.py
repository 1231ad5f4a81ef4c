"""A store may come from anywhere: reading never crashes, discloses the reader's memory or
allocates without bound.  These checks read in a child process (a crash must not take the test
run with it) under a memory limit; the rest (crafted headers, record paths, links, FIFOs and
devices, damaged records, all refused in this process) are in tests/unit/test_hostile_store.py.
Every store here is real, on disk, written by daskrl's writer and then damaged or crafted the
way a hostile or broken store would be."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hostile_stores import blosc_frame as _blosc
from hostile_stores import crafted_store as _crafted
from hostile_stores import written_store as _store

ROOT = Path(__file__).resolve().parents[1]


_LOAD = textwrap.dedent("""
    import resource, sys, hashlib
    limit = int(sys.argv[3]) << 20
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    import daskrl
    try:
        store = daskrl.open_store(sys.argv[1])
        out = store.load(int(sys.argv[2]))
    except daskrl.DaskrlError as e:
        print("REFUSED", type(e).__name__, str(e).replace(chr(10), " "))
    except BaseException as e:
        print("RAISED", type(e).__name__, str(e)[:300].replace(chr(10), " "))
    else:
        digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in out.values())).hexdigest()
        print("LOADED", digest)
""")


def _load_in_subprocess(url: str, batch_id: int = 0, mem_mib: int = 4096,
                        timeout: float = 120) -> tuple[int, str]:
    """Load a batch in a child process (a crash must not take the test run with it) under a
    memory limit; ``(returncode, its last line)``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", _LOAD, url, str(batch_id), str(mem_mib)],
                       capture_output=True, text=True, timeout=timeout, env=env)
    lines = r.stdout.strip().splitlines()
    return r.returncode, (lines[-1] if lines else r.stderr[-500:])


# -- 4: codec headers -------------------------------------------------------------------------
def test_a_blosc_frame_claiming_more_bytes_than_the_chunk_holds_discloses_nothing(tmp_path):
    """A 16-byte 'uncompressed' frame that claims 64 KiB: c-blosc would copy 64 KiB from past
    the chunk's buffer, the reader's own memory, and return it as the batch's data."""
    n = 4096 * 16
    url = _crafted(tmp_path, _blosc(n, n, n + 16, memcpyed=True))
    rc, line = _load_in_subprocess(url)
    assert rc == 0, (rc, line)
    assert line.startswith("REFUSED StoreError"), line
    assert "chunk 'blob/c/0/0'" in line
    assert f"blosc header declares a frame of {n + 16} bytes; the chunk holds 16" in line


def test_a_blosc_frame_with_block_offsets_far_outside_it_does_not_crash(tmp_path):
    """Claimed frame size 2 GiB, the block's data at 1 GiB: decoding would read unmapped
    memory (SIGSEGV) - the header is refused before c-blosc sees it."""
    n = 1 << 20
    body = struct.pack("<I", 1 << 30) + b"\0" * 64
    url = _crafted(tmp_path, _blosc(n, n, 0x7FFF0000, memcpyed=False, body=body), (1 << 16, 16))
    rc, line = _load_in_subprocess(url)
    assert rc == 0, f"the reader crashed (signal {-rc})" if rc < 0 else line
    assert line.startswith("REFUSED StoreError") and "blosc header declares a frame of" in line


def test_a_huge_uncompressed_blosc_claim_does_not_crash(tmp_path):
    """256 MiB 'stored' in a 16-byte frame: memcpy from far past the buffer (SIGSEGV)."""
    n = 1 << 28
    url = _crafted(tmp_path, _blosc(n, n, n + 16, memcpyed=True), (1 << 24, 16))
    rc, line = _load_in_subprocess(url)
    assert rc == 0, f"the reader crashed (signal {-rc})" if rc < 0 else line
    assert line.startswith("REFUSED StoreError"), line


# -- 5: paths from records ----------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_a_root_document_linked_to_dev_urandom_does_not_allocate_without_bound(tmp_path):
    url, root, _ = _store(tmp_path, n=1)
    (root / "zarr.json").unlink()
    (root / "zarr.json").symlink_to("/dev/urandom")
    rc, line = _load_in_subprocess(url, mem_mib=3072, timeout=100)
    assert rc == 0 and line.startswith("REFUSED "), (rc, line)
    assert "'zarr.json' in the store is a symbolic link" in line


# -- 9: the end records ------------------------------------------------------------------------
_REMOTE_CLAIM = textwrap.dedent("""
    import resource, struct, sys, zipfile, io, json
    limit = 3 << 30
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    import fsspec, numpy as np, daskrl
    from daskrl.store import TrajectoryStore
    url = "memory://hostile-claim"
    w = TrajectoryStore(url, read_only=False)
    w.initialize()
    noise = np.random.default_rng(0).integers(0, 255, (80, 4, 4096), dtype=np.uint8)  # 1.25 MiB
    meta = {"frames": 320, "weights_version": 0, "worker": "w", "device": "cpu",
            "episode_returns": [], "episode_lengths": [], "shape": [80, 4]}
    path, _ = w.write_batch(0, {"noise": noise}, meta, compression="none")
    fs = fsspec.filesystem("memory")
    with zipfile.ZipFile(io.BytesIO(fs.cat_file(f"{url}/{path}"))) as z:
        members = {n: z.read(n) for n in z.namelist()}
    doc = json.loads(members["noise/zarr.json"])
    doc["shape"][0] = 80 * 65536  # 80 GiB, all but one chunk absent (fill)
    members["noise/zarr.json"] = json.dumps(doc).encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for n, d in members.items():
            z.writestr(n, d)
    raw = bytearray(out.getvalue())
    # the end record claims an archive 3 GiB larger than the object: the directory is still
    # found in the object's last MiB, but the size bound would allow 3 TiB of arrays
    (cd_offset,) = struct.unpack_from("<I", raw, len(raw) - 6)
    struct.pack_into("<I", raw, len(raw) - 6, cd_offset + (3 << 30))
    fs.pipe_file(f"{url}/{path}", bytes(raw))
    try:
        daskrl.open_store(url).load(0)
    except daskrl.DaskrlError as e:
        print("REFUSED", type(e).__name__, str(e).replace(chr(10), " "))
    except BaseException as e:
        print("RAISED", type(e).__name__, str(e)[:300])
    else:
        print("LOADED")
""")


def test_a_remote_container_claiming_a_larger_size_cannot_make_the_reader_allocate(tmp_path):
    """On an object store the reader asks a large container's size (the object's, not what its
    end records claim): the inflated claim is refused before any chunk is fetched or allocated."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", _REMOTE_CLAIM], capture_output=True, text=True,
                       timeout=120, env=env)
    line = (r.stdout.strip().splitlines() or [r.stderr[-500:]])[-1]
    assert r.returncode == 0 and line.startswith("REFUSED StoreFormatError"), (r.returncode, line)
    assert "the end records describe an archive of" in line and "the file holds" in line, line
