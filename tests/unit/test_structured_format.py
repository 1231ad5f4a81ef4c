"""Store format 2.2: the arrays of Dict and Tuple spaces and of info under paths
(``observation/desired_goal``, ``observation/0``, ``info/lives``), written as nested zarr groups,
read back nested by daskrl and readable with zarr alone; the reader's member rules for such
paths (hostile names refused)."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest
import torch
import zarr
from zarr.storage import ZipStore

from daskrl import StoreFormatError
from daskrl._nested import flatten, nest, select, tree_map, valid_name
from daskrl.store import TrajectoryStore
from daskrl.store._format import encode_batch
from daskrl.store._format.encode import dimension_names

META = {"frames": 6, "weights_version": 0, "worker": "w", "device": "cpu",
        "episode_returns": [], "episode_lengths": [], "shape": [3, 2]}


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "observation/desired_goal": rng.normal(size=(3, 2, 2)).astype(np.float32),
        "observation/phase": rng.integers(0, 9, (3, 2)),
        "observation/pair/0": rng.integers(0, 2, (3, 2, 4)).astype(np.int8),
        "observation/pair/1": rng.normal(size=(3, 2)),
        "action/c": rng.integers(0, 3, (3, 2)),  # a Dict key named like a chunk prefix
        "action/move/0": rng.normal(size=(3, 2, 1)).astype(np.float32),
        "reward": rng.normal(size=(3, 2)).astype(np.float32),
        "info/lives": rng.integers(0, 3, (3, 2)),
        "info/_lives": rng.random((3, 2)) > 0.5,
    }


def test_names_paths_and_nesting():
    assert valid_name("observation") and valid_name("observation/desired_goal")
    assert valid_name("observation/0/a") and valid_name("info/_lives")
    for bad in ("0", "observation/01", "observation/", "observation/a-b", "a//b", "/a",
                "a/" + "/".join(["b"] * 8)):
        assert not valid_name(bad), bad
    flat = {"observation/a": 1, "observation/t/0": 2, "observation/t/1": 3, "reward": 4}
    tree = nest(flat)
    assert tree == {"observation": {"a": 1, "t": (2, 3)}, "reward": 4}
    assert flatten(tree) == flat
    assert nest({"observation/1": 5}) == {"observation": {"1": 5}}  # a part of a tuple
    assert tree_map(lambda x: x * 10, tree) == {"observation": {"a": 10, "t": (20, 30)},
                                                "reward": 40}
    assert select(flat, ["observation", "reward", "nope"]) == [
        "observation/a", "observation/t/0", "observation/t/1", "reward", "nope"]
    assert select(flat, ["observation/t"]) == ["observation/t/0", "observation/t/1"]
    with pytest.raises(ValueError, match="must not nest"):
        nest({"a": 1, "a/b": 2})


def test_dimension_names_of_structured_arrays():
    assert dimension_names("observation/desired_goal", 3) == [
        "time", "env", "observation.desired_goal_0"]
    assert dimension_names("observation/0", 4) == ["time", "env", "observation.0_0",
                                                   "observation.0_1"]


@pytest.mark.parametrize("compression", ["zstd", "lz4", "none"])
def test_nested_batch_round_trips_through_daskrl_and_zarr(tmp_path, compression):
    arrays = _arrays()
    store = TrajectoryStore(str(tmp_path / "s"), read_only=False)
    store.initialize()
    path, committed = store.write_batch(0, arrays, META, compression)
    assert committed
    batch = store.load(0)
    assert set(batch) == {"observation", "action", "reward", "info"}
    assert isinstance(batch["observation"]["pair"], tuple)
    for name, want in arrays.items():
        got = batch
        for part in name.split("/"):
            got = got[int(part)] if isinstance(got, tuple) else got[part]
        assert got.dtype == torch.from_numpy(want).dtype and np.array_equal(got.numpy(), want)
    # keys name an array or a group of them
    part = store.load(0, keys=["observation/pair", "info"])
    assert set(part) == {"observation", "info"} and set(part["info"]) == {"lives", "_lives"}
    assert np.array_equal(part["observation"]["pair"][1].numpy(), arrays["observation/pair/1"])
    # zarr alone: nested groups, one array per leaf, the same values
    with ZipStore(str(tmp_path / "s" / path), mode="r") as container:
        group = zarr.open_group(container, mode="r")
        assert isinstance(group["observation"], zarr.Group)
        assert sorted(group["observation"].group_keys()) == ["pair"]
        for name, want in arrays.items():
            assert np.array_equal(group[name][...], want), name
        assert group["observation/desired_goal"].metadata.dimension_names == (
            "time", "env", "observation.desired_goal_0")


def test_reads_nested_groups_that_zarr_python_writes(tmp_path):
    """A container zarr-python writes (its own member order, group documents, codecs within
    the allowlist) with arrays under groups reads through daskrl."""
    arrays = _arrays()
    path = tmp_path / "s" / "batches" / "000000000000-0123456789ab.zip"
    store = TrajectoryStore(str(tmp_path / "s"), read_only=False)
    store.initialize()
    path.parent.mkdir(parents=True, exist_ok=True)
    with ZipStore(str(path), mode="w") as zs:
        root = zarr.open_group(zs, mode="w", attributes={**META, "batch_id": 0})
        for name, a in arrays.items():
            root.create_array(name, data=a, chunks=(2, *a.shape[1:]))
    _commit(tmp_path / "s", "batches/000000000000-0123456789ab.zip")
    got = flatten(store.load(0))
    assert set(got) == set(arrays)
    for name, want in arrays.items():
        assert np.array_equal(got[name].numpy(), want), name


def _commit(root, path: str) -> None:
    """The commit record of batch 0 naming ``path`` (a container written by hand)."""
    (root / "commits" / "000000000000").mkdir(parents=True)
    (root / "commits" / "000000000000" / "zarr.json").write_text(json.dumps(
        {"zarr_format": 3, "node_type": "group",
         "attributes": {**META, "batch_id": 0, "path": path}}))


def _container(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), data)
    return buf.getvalue()


def _members(arrays: dict[str, np.ndarray]) -> dict[str, bytes]:
    batch = encode_batch({**META, "batch_id": 0}, arrays, "none")
    return {name: b"".join(bytes(memoryview(p)) for p in parts) for name, parts in batch.entries}


@pytest.mark.parametrize("change, problem", [
    (lambda m: m.update({"observation/a-b/zarr.json": m["reward/zarr.json"]}),
     "unexpected zip member 'observation/a-b/zarr.json'"),
    (lambda m: m.update({"observation/01/zarr.json": m["reward/zarr.json"]}),
     "unexpected zip member"),
    (lambda m: m.update({"0/zarr.json": m["reward/zarr.json"]}), "unexpected zip member"),
    (lambda m: m.update({"/".join(["a"] * 9) + "/zarr.json": m["reward/zarr.json"]}),
     "unexpected zip member"),
    # an array that is also a group: its chunks and an array under it
    (lambda m: m.update({"reward/x/zarr.json": m["reward/zarr.json"]}),
     "array 'reward' has chunks and arrays under it"),
    (lambda m: m.update({"observation/goal/c/0/0/0": m["reward/c/0/0"]}),
     "have no zarr.json"),
])
def test_hostile_structured_names_are_refused(tmp_path, change, problem):
    arrays = {"reward": np.zeros((3, 2), np.float32),
              "observation/pair/0": np.zeros((3, 2, 1), np.float32)}
    members = _members(arrays)
    change(members)
    store = TrajectoryStore(str(tmp_path / "s"), read_only=False)
    store.initialize()
    rel = "batches/000000000000-0123456789ab.zip"
    (tmp_path / "s" / "batches").mkdir(exist_ok=True)
    (tmp_path / "s" / rel).write_bytes(_container(members))
    _commit(tmp_path / "s", rel)
    with pytest.raises(StoreFormatError, match=problem):
        store.load(0)


def test_an_array_named_c_and_the_group_documents(tmp_path):
    """``action/c`` (a Dict key ``c``) keeps its chunks ``action/c/c/0/0``; the groups'
    documents are empty groups (never read by daskrl)."""
    members = _members(_arrays())
    assert "action/c/c/0/0" in members and "action/c/zarr.json" in members
    for group in ("observation", "observation/pair", "action", "action/move", "info"):
        doc = json.loads(members[f"{group}/zarr.json"])
        assert doc == {"zarr_format": 3, "node_type": "group", "attributes": {}}
