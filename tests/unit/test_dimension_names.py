"""Dimension names (store format 2.1): every dimension named, so that xarray opens any batch;
the reader accepts those names and 2.0's nulls, and refuses hostile ones before any data is
read."""

from __future__ import annotations

import json
import re
import sys
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr
from zarr.storage import ZipStore

import daskrl
import daskrl.data
from daskrl import StoreFormatError
from daskrl.store import TrajectoryStore
from daskrl.store._format.allowlist import MAX_DIMENSION_NAME, check_array_metadata
from daskrl.store._format.encode import dimension_names, encode_array

sys.path.insert(0, str(Path(__file__).parent.parent))
from sample_batches import sample_meta


def _pendulum_like(T: int = 7, E: int = 3) -> dict[str, np.ndarray]:
    """Arrays of different trailing sizes, as Pendulum's: observation 3, action 1."""
    rng = np.random.default_rng(4)
    return {"observation": rng.standard_normal((T, E, 3)).astype(np.float32),
            "action": rng.standard_normal((T, E, 1)).astype(np.float32),
            "pixels": rng.integers(0, 255, (T, E, 2, 4, 5), dtype=np.uint8),
            "reward": rng.standard_normal((T, E)).astype(np.float32)}


def _store(tmp_path: Path, arrays: dict[str, np.ndarray]) -> tuple[Path, str]:
    w = TrajectoryStore(str(tmp_path / "s"), read_only=False)
    w.initialize()
    T, E = next(iter(arrays.values())).shape[:2]
    path, _ = w.write_batch(0, arrays, sample_meta(T, E))
    return tmp_path / "s", path


def _rewrite(container: Path, change) -> None:
    """Rewrite every array's ``zarr.json`` of a container with ``change(name, doc)``."""
    with zipfile.ZipFile(container) as z:
        members = {n: z.read(n) for n in z.namelist()}
    for key in [k for k in members if k.endswith("/zarr.json")]:
        doc = json.loads(members[key])
        change(key.split("/")[0], doc)
        members[key] = json.dumps(doc).encode()
    container.unlink()
    with zipfile.ZipFile(container, "w") as z:  # stored, as zipfile writes it
        for name, data in members.items():
            z.writestr(name, data)


def test_the_rule_names_every_dimension():
    assert dimension_names("reward", 2) == ["time", "env"]
    assert dimension_names("observation", 3) == ["time", "env", "observation_0"]
    assert dimension_names("frame", 5) == ["time", "env", "frame_0", "frame_1", "frame_2"]
    doc = json.loads(dict(encode_array("action", np.zeros((4, 2, 1), np.int64), "zstd"))[
        "action/zarr.json"])
    assert doc["dimension_names"] == ["time", "env", "action_0"]
    assert check_array_metadata(doc, "x").shape == (4, 2, 1)


def test_xarray_opens_a_batch_of_different_trailing_sizes(tmp_path):
    arrays = _pendulum_like()
    root, path = _store(tmp_path, arrays)
    with ZipStore(root / path, mode="r") as zs:
        ds = xr.open_zarr(zs, consolidated=False)
        assert dict(ds.sizes) == {"time": 7, "env": 3, "observation_0": 3, "action_0": 1,
                                  "pixels_0": 2, "pixels_1": 4, "pixels_2": 5}
        assert ds["observation"].dims == ("time", "env", "observation_0")
        for name, a in arrays.items():
            assert np.array_equal(ds[name].values, a), name
    assert daskrl.open_store(str(root)).handle(0).path == path


def test_a_20_batch_with_null_names_still_reads(tmp_path):
    """A batch as format 2.0 wrote it (trailing names null) in a 2.0 store: daskrl reads it
    and names its dimensions by the rule; xarray alone cannot open it (why 2.1 names them)."""
    arrays = _pendulum_like()
    root, path = _store(tmp_path, arrays)

    def as_20(name, doc):
        doc["dimension_names"] = ["time", "env", *[None] * (len(doc["shape"]) - 2)]

    _rewrite(root / path, as_20)
    root_doc = json.loads((root / "zarr.json").read_text())
    root_doc["attributes"]["daskrl"]["format_version"] = "2.0"
    (root / "zarr.json").write_text(json.dumps(root_doc))
    store = daskrl.open_store(str(root))
    got = store.load(0)
    for name, a in arrays.items():
        assert np.array_equal(got[name].numpy(), a), name
    ds = daskrl.data.batch_to_xarray(store.handle(0))
    assert ds["action"].dims == ("time", "env", "action_0")
    for name, a in arrays.items():
        assert np.array_equal(ds[name].values, a), name
    with (ZipStore(root / path, mode="r") as zs, warnings.catch_warnings(),
          pytest.raises(ValueError, match="conflicting sizes for dimension None")):
        warnings.simplefilter("ignore")  # xarray first warns of the repeated None
        xr.open_zarr(zs, consolidated=False)


def test_names_the_store_does_not_hold_do_not_matter_to_daskrl(tmp_path):
    """Names zarr accepts but daskrl does not write (e.g. a shared trailing name of one size)
    pass the allowlist; daskrl's view keeps its own rule, so batches always line up."""
    arrays = _pendulum_like()
    root, path = _store(tmp_path, arrays)
    _rewrite(root / path, lambda name, doc: doc.update(
        dimension_names=[f"d{i}" for i in range(len(doc["shape"]))]))
    ds = daskrl.data.to_xarray(daskrl.open_store(str(root)), layout="time")
    assert ds["observation"].dims == ("time", "env", "observation_0")
    assert np.array_equal(ds["pixels"].values, arrays["pixels"])


_HOSTILE = [
    (["time"], "is not a list of 3 entries (one per dimension)"),
    (["time", "env", "o", "x"], "is not a list of 3 entries"),
    ("time env o", "is not a list of 3 entries"),
    ({"0": "time"}, "is not a list of 3 entries"),
    (["time", "env", 7], "dimension name 7 is not null or a string of 1 to 255 printable"),
    (["time", "env", ["o"]], "dimension name ['o'] is not null"),
    (["time", "env", ""], "dimension name '' is not null"),
    (["time", "env", "\x1b[2J"], "dimension name '\\x1b[2J' is not null"),
    (["time", "env", "a\nb"], "dimension name 'a\\nb' is not null"),
    (["time", "env", "x" * (MAX_DIMENSION_NAME + 1)], "dimension name 'xxxxx"),
    (["time", "env", "time"], "repeat a name"),
]


@pytest.mark.parametrize(("names", "problem"), _HOSTILE)
def test_hostile_dimension_names_are_refused(names, problem):
    doc = json.loads(dict(encode_array("o", np.zeros((4, 2, 3), np.float32), "zstd"))[
        "o/zarr.json"])
    with pytest.raises(StoreFormatError, match="^x: .*" + re.escape(problem)):
        check_array_metadata({**doc, "dimension_names": names}, "x")
    # what may be there: absent, nulls (2.0), any distinct printable names
    for ok in (None, [None, None, None], ["time", "env", None], ["a", "b", "c"],
               ["t", "e", "x" * MAX_DIMENSION_NAME]):
        check_array_metadata({**doc, "dimension_names": ok}, "x")
    del doc["dimension_names"]
    check_array_metadata(doc, "x")


def test_a_hostile_name_in_a_store_is_refused_naming_batch_and_array(tmp_path):
    root, path = _store(tmp_path, _pendulum_like())
    _rewrite(root / path, lambda name, doc: doc.update(dimension_names=["t", "e", "x" * 10**5])
             if name == "observation" else None)
    store = daskrl.open_store(str(root))
    msg = f"batch 0 ({path!r}), array 'observation': dimension name 'xxxxx"
    with pytest.raises(StoreFormatError, match=re.escape(msg)) as e:
        store.load(0)
    assert len(str(e.value)) < 1000  # the untrusted name is cut in the message
    with pytest.raises(StoreFormatError, match=re.escape(msg)):
        daskrl.data.to_xarray(store)
    assert store.load(0, keys=["reward"])["reward"].shape == (7, 3)


def test_zarr_reads_the_named_batch(tmp_path):
    root, path = _store(tmp_path, _pendulum_like())
    with ZipStore(root / path, mode="r") as zs:
        group = zarr.open_group(zs, mode="r")
        assert group["pixels"].metadata.dimension_names == (
            "time", "env", "pixels_0", "pixels_1", "pixels_2")


def test_an_array_named_like_a_dimension_is_refused_by_the_view(tmp_path):
    """An extra policy output may be named ``env``: xarray cannot hold it next to dimension
    ``env``, so the view says which array to leave out."""
    arrays = {**_pendulum_like(), "env": np.zeros((7, 3), np.float32)}
    root, _ = _store(tmp_path, arrays)
    store = daskrl.open_store(str(root))
    with pytest.raises(daskrl.ConfigError, match=r"array 'env' of store .* pass keys= without"):
        daskrl.data.to_xarray(store, layout="time")
    ds = daskrl.data.to_xarray(store, ["reward", "action"], layout="time")
    assert np.array_equal(ds["action"].values, arrays["action"])
