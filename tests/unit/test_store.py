"""The zarr store on a local directory and in memory://: commits, visibility, reading back."""

from __future__ import annotations

import json
import pickle
import re
import uuid
import zipfile

import numpy as np
import pytest
import torch
import zarr

import daskrl
from daskrl import BatchNotFoundError, StoreFormatError
from daskrl.store import FORMAT_VERSION, TrajectoryStore


def _arrays(T=4, E=2, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "observation": rng.standard_normal((T, E, 3)).astype(np.float32),
        "reward": rng.standard_normal((T, E)).astype(np.float32),
        "terminated": rng.random((T, E)) < 0.3,
        "episode_id": np.arange(T * E, dtype=np.int64).reshape(T, E),
    }


def _meta(frames=8):
    return {"frames": frames, "weights_version": 0, "worker": "w", "device": "cpu",
            "episode_returns": [1.0], "episode_lengths": [3], "path": "", "shape": [4, 2]}


@pytest.fixture(params=["local", "memory"])
def url(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "store")
    return f"memory://daskrl-test-{uuid.uuid4().hex}"


def test_write_commit_and_read_back(url):
    w = TrajectoryStore(url, read_only=False)
    w.initialize()
    arrays = _arrays()
    path, committed = w.write_batch(7, arrays, _meta())
    assert committed
    store = daskrl.open_store(url)
    assert len(store) == 1 and store.frames == 8 and store.batch_ids() == [7]
    batch = store.load(7)
    for k, v in arrays.items():
        assert batch[k].dtype == torch.from_numpy(v).dtype and np.array_equal(batch[k].numpy(), v)
    handle = next(iter(store))
    assert handle.batch_id == 7 and handle.path == path and handle.episode_returns == (1.0,)
    assert np.array_equal(handle.load(keys=["reward"])["reward"].numpy(), arrays["reward"])
    assert set(handle.load(device="cpu")) == set(arrays)


def test_second_commit_of_same_batch_is_dropped(url):
    w = TrajectoryStore(url, read_only=False)
    w.initialize()
    first, ok1 = w.write_batch(1, _arrays(seed=1), _meta())
    _, ok2 = w.write_batch(1, _arrays(seed=2), _meta())
    assert ok1 and not ok2
    store = daskrl.open_store(url)
    assert len(store) == 1 and store.handle(1).path == first
    assert np.array_equal(store.load(1)["observation"].numpy(), _arrays(seed=1)["observation"])


def test_uncommitted_data_is_invisible(tmp_path):
    url = str(tmp_path / "s")
    w = TrajectoryStore(url, read_only=False)
    w.initialize()
    # Attempts that died before their commit: data present, no commit record.
    path, _ = w.write_batch(3, _arrays(), _meta())
    (tmp_path / "s" / "commits" / "000000000003" / "zarr.json").unlink()
    group = zarr.open_group(str(tmp_path / "s"), mode="a").require_group("batches/000000000004-dead")
    group.create_array("reward", data=np.ones((2, 2), np.float32))
    store = daskrl.open_store(url)
    assert len(store) == 0 and (tmp_path / "s" / path).is_file()
    for bid in (3, 4):
        with pytest.raises(BatchNotFoundError, match=re.escape(f"no committed batch {bid}")):
            store.load(bid)


def test_handles_are_small_and_carry_no_credentials():
    url = f"memory://daskrl-test-{uuid.uuid4().hex}"
    w = TrajectoryStore(url, {"secret_token": "SECRET"}, read_only=False)
    w.initialize()
    meta = _meta() | {"episode_returns": [float(i) for i in range(200)],
                      "episode_lengths": list(range(200))}
    w.write_batch(0, _arrays(), meta)
    store = daskrl.open_store(url, {"secret_token": "SECRET"})
    handle = store.handle(0)
    data = pickle.dumps(handle)
    assert len(data) < 4096 and b"SECRET" not in data and handle.needs_options
    # no process-wide registry of options: a handle loads through its store object, which it
    # keeps in this process only; unpickled elsewhere it needs the store
    assert handle.load(keys=["reward"])["reward"].shape == (4, 2)
    with pytest.raises(daskrl.StoreOptionsRequiredError, match=r"pass store=|load\(store="):
        pickle.loads(data).load(keys=["reward"])
    assert pickle.loads(data) == handle
    assert handle.load(keys=["reward"], store=store)["reward"].shape == (4, 2)
    assert store.load(pickle.loads(data), keys=["reward"])["reward"].shape == (4, 2)


def test_a_batch_is_one_zip_container_readable_with_zarr_alone(tmp_path):
    url = str(tmp_path / "s")
    w = TrajectoryStore(url, read_only=False)
    w.initialize()
    arrays = _arrays()
    path, _ = w.write_batch(0, arrays, _meta())
    # the whole batch: one file; commit record, root and sub-groups: JSON zarr v3 documents
    assert re.fullmatch(r"batches/000000000000-[0-9a-f]{12}\.zip", path)
    assert sorted(p.name for p in (tmp_path / "s" / "batches").iterdir()) == [
        path.split("/")[1], "zarr.json"]
    for f in (tmp_path / "s").rglob("zarr.json"):
        assert json.loads(f.read_text())["zarr_format"] == 3
    root = zarr.open_group(url, mode="r")
    assert root.attrs["daskrl"]["format_version"] == FORMAT_VERSION == "2.3"
    with zipfile.ZipFile(tmp_path / "s" / path) as z:
        assert z.testzip() is None
        infos = z.infolist()
        assert {i.compress_type for i in infos} == {zipfile.ZIP_STORED}
        chunks = {f"{k}/c/0" + "/0" * (a.ndim - 1) for k, a in arrays.items()}
        assert {i.filename for i in infos} == {"zarr.json", *(f"{k}/zarr.json" for k in arrays),
                                               *chunks}
        assert b"pickle" not in z.read("reward/zarr.json")
    group = zarr.open_group(zarr.storage.ZipStore(tmp_path / "s" / path, mode="r"), mode="r")
    assert group.attrs["path"] == path and group.attrs["batch_id"] == 0
    assert sorted(group.array_keys()) == sorted(arrays)
    for k, v in arrays.items():
        np.testing.assert_array_equal(group[k][...], v)
    codecs = group["reward"].metadata.codecs
    assert any(c.__class__.__name__ == "Crc32cCodec" for c in codecs)


def test_reader_refuses_other_stores_and_newer_major_versions(tmp_path):
    with pytest.raises(StoreFormatError, match="no daskrl store"):
        daskrl.open_store(str(tmp_path / "nothing"))
    zarr.open_group(str(tmp_path / "plain"), mode="w")
    with pytest.raises(StoreFormatError, match="not a daskrl store"):
        daskrl.open_store(str(tmp_path / "plain"))
    w = TrajectoryStore(str(tmp_path / "new"), read_only=False)
    w.initialize()
    doc = json.loads((tmp_path / "new" / "zarr.json").read_text())
    doc["attributes"]["daskrl"]["format_version"] = "3.0"
    (tmp_path / "new" / "zarr.json").write_text(json.dumps(doc))
    with pytest.raises(StoreFormatError, match=re.escape(
            "format version '3.0'; this daskrl reads versions 2.x. Upgrade daskrl.")):
        daskrl.open_store(str(tmp_path / "new"))


def test_a_1x_store_is_refused_as_unsupported(tmp_path):
    """Format 1.x (a group directory per batch) was never released: it is not read."""
    w = TrajectoryStore(str(tmp_path / "old"), read_only=False)
    w.initialize()
    doc = json.loads((tmp_path / "old" / "zarr.json").read_text())
    doc["attributes"]["daskrl"]["format_version"] = "1.0"
    (tmp_path / "old" / "zarr.json").write_text(json.dumps(doc))
    msg = "has format version '1.0' (a group directory per batch, a development format that was "
    with pytest.raises(StoreFormatError, match=re.escape(msg) + ".*unsupported"):
        daskrl.open_store(str(tmp_path / "old"))
    with pytest.raises(StoreFormatError, match=re.escape(msg)):
        TrajectoryStore(str(tmp_path / "old"), read_only=False).write_batch(0, _arrays(), _meta())


def test_runs_get_distinct_numbers(tmp_path):
    w = TrajectoryStore(str(tmp_path / "s"), read_only=False)
    w.initialize()
    assert [w.register_run({}) for _ in range(3)] == [0, 1, 2]
    assert TrajectoryStore(str(tmp_path / "s"), read_only=False).register_run({}) == 3


def _member_data_offset(zip_path, name):
    with zipfile.ZipFile(zip_path) as z:
        info = z.getinfo(name)
    return info.header_offset + 30 + len(name.encode())


def test_chunk_corruption_is_detected_on_read(tmp_path):
    url = str(tmp_path / "s")
    w = TrajectoryStore(url, read_only=False)
    w.initialize()
    path, _ = w.write_batch(0, _arrays(), _meta(), compression="none")
    zpath = tmp_path / "s" / path
    raw = bytearray(zpath.read_bytes())
    raw[_member_data_offset(zpath, "observation/c/0/0/0") + 5] ^= 0xFF
    zpath.write_bytes(bytes(raw))
    with pytest.raises(daskrl.StoreError, match=re.escape("array 'observation' of batch") + ".*"
                       + re.escape("chunk 'observation/c/0/0/0': crc32c mismatch")):
        daskrl.open_store(url).load(0)
    assert daskrl.open_store(url).load(0, keys=["reward"])["reward"].shape == (4, 2)


@pytest.mark.parametrize("compression", ["zstd", "lz4", "none"])
@pytest.mark.parametrize(("dtype", "shape"), [
    (np.float32, (37, 3, 4)), (np.float32, (37, 5, 10)), (np.bool_, (5, 2)), (np.int64, (9, 2)), (np.uint8, (6, 2, 84, 84)),
    (np.float16, (3, 1)), (np.float64, (4, 2, 1)),
])
def test_encoded_arrays_are_byte_identical_to_zarr_python(dtype, shape, compression):
    """daskrl writes zarr v3 itself (for speed); the bytes must be what zarr-python writes."""
    import asyncio

    import zarr.codecs
    from zarr.core.buffer import default_buffer_prototype
    from zarr.storage import MemoryStore

    from daskrl.config import Compression
    from daskrl.store._format import encode as zarr_encode

    rng = np.random.default_rng(0)
    arr = (rng.standard_normal(shape) * 50).astype(dtype)
    ours = dict(zarr_encode.encode_array("a", arr, Compression(compression), chunk_bytes=4096))
    comp = {"zstd": [zarr.codecs.ZstdCodec(level=1)],
            "lz4": [zarr.codecs.BloscCodec(cname="lz4", clevel=1, shuffle="shuffle", typesize=arr.dtype.itemsize)],
            "none": []}[compression]
    store = MemoryStore()
    ref = zarr.create_array(store, name="a", shape=arr.shape, dtype=arr.dtype,
                            chunks=(zarr_encode.chunk_rows(arr, 4096), *arr.shape[1:]),
                            compressors=[*comp, zarr.codecs.Crc32cCodec()], fill_value=0,
                            dimension_names=zarr_encode.dimension_names("a", arr.ndim),
                            config={"write_empty_chunks": True})
    ref[...] = arr

    async def items():
        return {k: (await store.get(k, default_buffer_prototype())).to_bytes()
                async for k in store.list_prefix("a/")}

    theirs = asyncio.run(items())
    assert set(ours) == set(theirs)
    assert json.loads(ours["a/zarr.json"]) == json.loads(theirs["a/zarr.json"])
    for key in ours:
        if key != "a/zarr.json":
            assert ours[key] == theirs[key], key
    # and zarr reads ours back
    mine = MemoryStore()
    proto = default_buffer_prototype()
    for key, data in ours.items():
        asyncio.run(mine.set(key, proto.buffer.from_bytes(data)))
    np.testing.assert_array_equal(zarr.open_array(mine, path="a", mode="r")[...], arr)


def test_a_large_batch_is_written_by_the_pool_and_read_whole(tmp_path):
    """Above 4 MiB the container's data is written by the thread pool while its CRC-32s are
    computed, headers last; several 8 MiB chunks per array, read in parallel."""
    rng = np.random.default_rng(5)
    arrays = {"observation": rng.integers(0, 255, (80, 4, 84, 84, 4), dtype=np.uint8),
              "reward": rng.standard_normal((80, 4)).astype(np.float32)}
    url = str(tmp_path / "s")
    w = TrajectoryStore(url, read_only=False)
    w.initialize()
    for bid, compression in enumerate(["none", "zstd"]):
        path, _ = w.write_batch(bid, arrays, _meta(), compression=compression)
        with zipfile.ZipFile(tmp_path / "s" / path) as z:
            assert z.testzip() is None
            assert len([n for n in z.namelist() if n.startswith("observation/c/")]) == 2
        got = daskrl.open_store(url).load(bid)
        for k, v in arrays.items():
            np.testing.assert_array_equal(got[k].numpy(), v)


def test_a_read_only_store_refuses_writes(tmp_path):
    url = str(tmp_path / "s")
    TrajectoryStore(url, read_only=False).initialize()
    r = daskrl.open_store(url)
    with pytest.raises(daskrl.StoreError, match=re.escape("cannot write batch 0: store")):
        r.write_batch(0, _arrays(), _meta())
    assert [p.name for p in (tmp_path / "s" / "batches").iterdir()] == ["zarr.json"] and len(r) == 0
