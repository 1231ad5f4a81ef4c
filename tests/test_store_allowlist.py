"""A store written by a real collection holds only JSON documents and allowlisted chunks."""

from __future__ import annotations

import json
import zipfile

import daskrl
from daskrl.store._format.allowlist import check_array_metadata
from daskrl.testing import TagPolicy


def test_a_real_store_holds_only_json_and_allowlisted_numeric_chunks(tmp_path, inproc_client):
    """No pickle anywhere: every file is a JSON zarr.json or a chunk of an allowlisted array."""
    url = str(tmp_path / "store")
    with daskrl.Collector("daskrl.testing:Counting-v0", TagPolicy(), url, client=inproc_client,
                          envs_per_worker=2, frames_per_batch=20, total_frames=40) as c:
        list(c)
    root = tmp_path / "store"
    docs: dict[str, bytes] = {}  # every JSON document: store files and container members
    chunks: dict[str, bytes] = {}
    for f in (p for p in root.rglob("*") if p.is_file()):
        key = f.relative_to(root).as_posix()
        if f.suffix == ".zip":
            assert key.startswith("batches/")
            with zipfile.ZipFile(f) as z:
                assert z.testzip() is None
                for name in z.namelist():
                    (docs if name.endswith("zarr.json") else chunks)[f"{key}/{name}"] = z.read(name)
        else:
            assert f.name == "zarr.json", key  # nothing but JSON outside the containers
            docs[key] = f.read_bytes()
    array_dirs = set()
    for key, text in docs.items():
        doc = json.loads(text)  # JSON, nothing else
        assert b"pickle" not in text.lower()
        if doc["node_type"] == "array":
            check_array_metadata(doc, key)
            array_dirs.add(key.rsplit("/", 1)[0])
        else:
            assert doc == {"zarr_format": 3, "node_type": "group",
                           "attributes": doc["attributes"]}
    assert len(array_dirs) >= 2 * 9
    for key, data in chunks.items():  # a chunk: under <array>/c/
        assert key[:key.index("/c/")] in array_dirs, key
        assert not data.startswith(b"\x80\x04\x95"), key  # no pickle stream
