"""A handle reads through any ``ReadingStore`` (the store module it does not import registers
how one is opened from a URL), and pickles under ``daskrl.store``, whose import imports the
store; ``daskrl.store._handles`` names the same class."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch

import daskrl
import daskrl.data
import daskrl.store._handles
from daskrl import BatchHandle, UsageError
from daskrl.store import TrajectoryStore

META = {"frames": 8, "weights_version": 0, "worker": "w", "device": "cpu",
        "episode_returns": [], "episode_lengths": [], "shape": [4, 2]}
REWARD = np.arange(8, dtype=np.float32).reshape(4, 2)


class Recording:
    """A ``ReadingStore`` of daskrl's protocol that is not a ``TrajectoryStore``."""

    url = "file:///elsewhere"

    def __init__(self) -> None:
        self.asked: list[tuple[int, str | None, list[str] | None]] = []

    def load(self, batch: BatchHandle, device: torch.device | str | None = None,
             keys: Sequence[str] | None = None) -> dict[str, Any]:
        self.asked.append((batch.batch_id, str(device) if device else None,
                           list(keys) if keys is not None else None))
        return {"reward": torch.zeros(4, 2)}


@pytest.fixture
def handle(tmp_path) -> BatchHandle:
    w = TrajectoryStore(tmp_path / "s", read_only=False)
    w.initialize()
    w.write_batch(0, {"reward": REWARD}, META)
    return pickle.loads(pickle.dumps(daskrl.open_store(w.url).handle(0)))  # no store object


def test_a_handle_without_a_store_object_opens_a_trajectory_store_from_its_url(handle):
    store = handle.reading_store()
    assert isinstance(store, TrajectoryStore) and store.url == handle.store_url
    np.testing.assert_array_equal(handle.load(keys=["reward"])["reward"].numpy(), REWARD)
    np.testing.assert_array_equal(
        handle.load(keys=["reward"], storage_options={})["reward"].numpy(), REWARD)


def test_a_handle_reads_through_the_reading_store_it_is_given(handle):
    given = Recording()
    assert set(handle.load("cpu", ["reward"], store=given)) == {"reward"}
    assert set(handle.with_store(given).load(keys=["reward"])) == {"reward"}
    assert handle.with_store(given).reading_store() is given
    assert given.asked == [(0, "cpu", ["reward"]), (0, None, ["reward"])]


def test_batch_to_xarray_refuses_a_reading_store_it_cannot_view(handle):
    with pytest.raises(UsageError, match=r"reads through a TrajectoryStore.*Recording.*"
                                         r"store=open_store"):
        daskrl.data.batch_to_xarray(handle.with_store(Recording()))


def test_a_handle_pickles_under_daskrl_store_and_its_former_module_names_it():
    assert BatchHandle.__module__ == "daskrl.store"
    assert daskrl.store._handles.BatchHandle is BatchHandle is daskrl.store.BatchHandle
    h = BatchHandle("file:///s", 7, 8, 2, 1, "w", "cpu", (), (), "batches/000000000007-a.zip")
    data = pickle.dumps(h, 4)
    assert b"\x8c\x0cdaskrl.store\x94\x8c\x0bBatchHandle" in data and pickle.loads(data) == h
