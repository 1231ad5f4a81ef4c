"""A store writer run as its own OS process by tests/test_store_processes.py and the S3 tests.

    python store_writer_proc.py write URL TAG FIRST COUNT GO_FILE [OPTIONS_JSON]
        wait for GO_FILE, then write batches FIRST..FIRST+COUNT-1, every array filled from TAG
    python store_writer_proc.py pause URL TAG ID MARKER RESUME
        write batch ID, but stop inside the commit's exclusive create (after its temp file is
        written, before it is linked into place): touch MARKER, wait for RESUME, then finish
    python store_writer_proc.py loop URL TAG FIRST
        write batches FIRST, FIRST+1, ... until killed
    python store_writer_proc.py stop URL TAG ID MARKER WHERE [OPTIONS_JSON]
        write batch ID, but stop itself (SIGSTOP) at WHERE: "before-commit" (its container
        written, its commit not begun) or "in-link" (the commit's temp file written, not yet
        linked): touch MARKER first; once continued (SIGCONT), finish
    python store_writer_proc.py gc URL MARKER
        collect garbage (one hour's grace), stopping itself (SIGSTOP) just before it deletes
        the first container: touch MARKER first; once continued, finish and print the report
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

from daskrl.store import TrajectoryStore

T, E = 32, 4


def batch_arrays(batch_id: int, tag: int, width: int = 512) -> dict[str, np.ndarray]:
    """Content a test can check: every value derives from (batch_id, tag)."""
    rng = np.random.default_rng([batch_id, tag])
    return {
        "observation": rng.standard_normal((T, E, width)).astype(np.float32),
        "reward": np.full((T, E), tag, np.float32),
        "episode_id": np.full((T, E), batch_id, np.int64),
        "terminated": rng.random((T, E)) < 0.1,
    }


def meta(tag: int) -> dict:
    return {"frames": T * E, "weights_version": tag, "worker": f"proc-{tag}", "device": "cpu",
            "episode_returns": [float(tag)], "episode_lengths": [1], "shape": [T, E]}


def _store(url: str, options: str | None = None) -> TrajectoryStore:
    store = TrajectoryStore(url, json.loads(options) if options else None, read_only=False)
    store.initialize()
    return store


def main(argv: list[str]) -> None:
    mode, url = argv[0], argv[1]
    tag = int(argv[2]) if mode != "gc" else 0
    if mode == "write":
        first, count, go = int(argv[3]), int(argv[4]), Path(argv[5])
        store = _store(url, argv[6] if len(argv) > 6 else None)
        while not go.exists():
            time.sleep(0.005)
        for bid in range(first, first + count):
            _, committed = store.write_batch(bid, batch_arrays(bid, tag), meta(tag),
                                             compression="zstd")
            print(bid, int(committed), flush=True)
    elif mode == "pause":
        bid, marker, resume = int(argv[3]), Path(argv[4]), Path(argv[5])
        store = _store(url)
        real_link = os.link

        def slow_link(src, dst, *a, **kw):
            if "commits" in str(dst):
                marker.touch()
                while not resume.exists():
                    time.sleep(0.01)
            return real_link(src, dst, *a, **kw)

        os.link = slow_link  # LocalStore's exclusive create: temp file, then os.link
        _, committed = store.write_batch(bid, batch_arrays(bid, tag), meta(tag), compression="none")
        print(bid, int(committed), flush=True)
    elif mode == "stop":
        bid, marker, where = int(argv[3]), Path(argv[4]), argv[5]
        store = _store(url, argv[6] if len(argv) > 6 else None)

        def stop() -> None:
            marker.touch()
            os.kill(os.getpid(), signal.SIGSTOP)

        if where == "before-commit":
            real_create = store.backend.create_exclusive

            def create(key, data):
                if key.startswith("commits/") and not marker.exists():
                    stop()
                return real_create(key, data)

            store.backend.create_exclusive = create  # type: ignore[method-assign]
        else:
            real_link = os.link

            def link(src, dst, *a, **kw):
                if "commits" in str(dst) and not marker.exists():
                    stop()
                return real_link(src, dst, *a, **kw)

            os.link = link
        _, committed = store.write_batch(bid, batch_arrays(bid, tag), meta(tag), compression="none")
        print(bid, int(committed), flush=True)
    elif mode == "gc":
        marker = Path(argv[2])
        store = TrajectoryStore(url, read_only=False)
        real_unlink = os.unlink

        def unlink(path, *a, **kw):
            if "/batches/" in str(path) and not marker.exists():
                marker.touch()
                os.kill(os.getpid(), signal.SIGSTOP)
            return real_unlink(path, *a, **kw)

        os.unlink = unlink
        print(json.dumps(list(store.collect_garbage(3600).attempts)), flush=True)
    elif mode == "loop":
        store = _store(url)
        bid = int(argv[3])
        while True:
            store.write_batch(bid, batch_arrays(bid, tag, width=4096), meta(tag),
                              compression="none")
            bid += 1
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
