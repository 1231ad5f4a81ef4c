"""The readers' package ``daskrl.data``: its names, the top-level names that stay, and the
store's methods and names that moved there, each of which says where to."""

from __future__ import annotations

import re

import pytest
from sample_batches import sample_arrays, sample_meta

import daskrl
import daskrl.data
from daskrl import UsageError
from daskrl.store import TrajectoryStore


def _store(tmp_path) -> TrajectoryStore:
    store = TrajectoryStore(str(tmp_path / "s"), read_only=False)
    store.initialize()
    for b in range(2):
        store.write_batch(b, sample_arrays(seed=b), sample_meta())
    return store


def test_the_top_level_names_are_the_readers():
    for name in ("Episode", "ReplayDataset", "TransitionDataset"):
        assert getattr(daskrl, name) is getattr(daskrl.data, name)
    assert set(daskrl.data.__all__) == {
        "Episode", "GroupShuffleSampler", "ReplayDataset", "TransitionDataset",
        "batch_to_xarray", "episodes", "to_dask", "to_xarray"}
    assert set(dir(daskrl.data)) >= set(daskrl.data.__all__)


@pytest.mark.parametrize("method", ["episodes", "to_dask", "to_xarray"])
def test_the_stores_reader_methods_name_their_replacement(tmp_path, method):
    store = _store(tmp_path)
    with pytest.raises(UsageError, match=re.escape(f"use daskrl.data.{method}(store, ...)")):
        getattr(store, method)(["reward"])
    assert getattr(daskrl.data, method)(store, ["reward"]) is not None


def test_the_handles_to_xarray_names_its_replacement(tmp_path):
    handle = _store(tmp_path).handle(1)
    with pytest.raises(UsageError, match=re.escape("daskrl.data.batch_to_xarray(handle, ...)")):
        handle.to_xarray()
    ds = daskrl.data.batch_to_xarray(handle, ["reward"])
    assert ds.attrs["batch_id"] == 1 and ds["reward"].dims == ("time", "env")
    assert ds["reward"].shape == (6, 2)


@pytest.mark.parametrize("name", ["Episode", "GroupShuffleSampler", "ReplayDataset",
                                  "TransitionDataset"])
def test_a_reader_imported_from_the_store_says_where_it_went(name):
    with pytest.raises(ImportError, match=re.escape(f"from daskrl.data import {name}")):
        exec(f"from daskrl.store import {name}", {})

