"""Write a store of format 1.0 (one directory tree per batch attempt), as daskrl 1.x wrote it.

daskrl now writes format 2.x only; readers must still read 1.x stores.  This helper writes one
with the same encoder and file I/O the 1.x writer used (``encode_array_parts`` for the arrays,
files created in place, the commit record created atomically and exclusively).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from daskrl.config import Compression
from daskrl.store._format import local_io
from daskrl.store._format.encode import encode_array_parts, group_document


def _group(attributes: dict[str, Any]) -> bytes:
    return json.dumps({"zarr_format": 3, "node_type": "group", "attributes": attributes},
                      indent=1).encode()


def create_v1_store(root: Path) -> None:
    root.mkdir(parents=True)
    meta = {"daskrl": {"format": "daskrl.trajectories", "format_version": "1.0"}}
    local_io.create_exclusive(root, "zarr.json", _group(meta))
    for sub in ("runs", "batches", "commits"):
        local_io.create_exclusive(root, f"{sub}/zarr.json", _group({}))


def write_v1_batch(root: Path, batch_id: int, arrays: dict[str, np.ndarray], meta: dict[str, Any],
                   compression: str = "zstd") -> str:
    """Write and commit batch ``batch_id`` as 1.x did; returns its attempt path."""
    path = f"batches/{batch_id:012d}-{uuid.uuid4().hex[:12]}"
    meta = {**meta, "batch_id": batch_id, "path": path}
    files: list[tuple[str, list[Any]]] = [(f"{path}/zarr.json", [group_document(meta)])]
    for name, arr in arrays.items():
        files.extend(encode_array_parts(f"{path}/{name}", arr, Compression(compression)))
    local_io.write_new_files(root, files)
    assert local_io.create_exclusive(root, f"commits/{batch_id:012d}/zarr.json", _group(meta))
    return path
