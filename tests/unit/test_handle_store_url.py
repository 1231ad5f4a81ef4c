"""``BatchHandle.store_url`` names the store's URL (``load(store=...)`` and ``Collector.store``
are store objects); ``handle.store`` still reads, with a ``DeprecationWarning``, and handles
pickled or sent over the wire by daskrl before the rename read back."""

from __future__ import annotations

import pickle
import re

import pytest

from daskrl import BatchHandle

URL = "file:///data/s"
PICKLED_WITH_STORE = (  # pickle.dumps(handle, protocol=4) when the field was named ``store``
    b"\x80\x04\x95\x90\x01\x00\x00\x00\x00\x00\x00\x8c\x15daskrl.store._handles\x94\x8c\x0bBat"
    b"chHandle\x94\x93\x94)\x81\x94}\x94(\x8c\x05store\x94\x8c\x0efile:///data/s\x94\x8c\x08bat"
    b"ch_id\x94K\x07\x8c\x06frames\x94K\x08\x8c\x0fweights_version\x94K\x02\x8c\npolicy_lag\x94"
    b"K\x01\x8c\x06worker\x94\x8c\ttcp://w:1\x94\x8c\x06device\x94\x8c\x03cpu\x94\x8c\x0fepisod"
    b"e_returns\x94G@\x08\x00\x00\x00\x00\x00\x00\x85\x94\x8c\x0fepisode_lengths\x94K\x03\x85"
    b"\x94\x8c\x04path\x94\x8c\x1cbatches/000000000007-abc.zip\x94\x8c\x05shape\x94K\x04K\x02"
    b"\x86\x94\x8c\x0frollout_seconds\x94G\x00\x00\x00\x00\x00\x00\x00\x00\x8c\rwrite_seconds"
    b"\x94G\x00\x00\x00\x00\x00\x00\x00\x00\x8c\x0cenv_restarts\x94K\x00\x8c\repisode_stats\x94"
    b")\x8c\rneeds_options\x94\x89\x8c\x03env\x94K\x00\x8c\r_store_object\x94Nub."
)
WIRE_BEFORE_RENAME = (URL, 7, 8, 2, 1, "tcp://w:1", "cpu", (3.0,), (3,),
                      "batches/000000000007-abc.zip", (4, 2), 0.0, 0.0, 0, (), False, 0)


def _handle() -> BatchHandle:
    return BatchHandle(URL, 7, 8, 2, 1, "tcp://w:1", "cpu", (3.0,), (3,),
                       "batches/000000000007-abc.zip", shape=(4, 2))


def test_the_url_is_store_url():
    h = _handle()
    assert h.store_url == URL
    assert "store_url='file:///data/s'" in repr(h)


def test_store_still_reads_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match=re.escape(
            "BatchHandle.store is deprecated: it is the store's URL, now named "
            "BatchHandle.store_url.")):
        assert _handle().store == URL


def test_a_handle_pickled_before_the_rename_reads_back():
    h = pickle.loads(PICKLED_WITH_STORE)
    assert h == _handle() and h.store_url == URL
    assert "store" not in vars(h)
    assert pickle.loads(pickle.dumps(h)) == h


def test_the_wire_form_is_unchanged():
    assert _handle().to_wire() == WIRE_BEFORE_RENAME
    assert BatchHandle.from_wire(WIRE_BEFORE_RENAME) == _handle()


def test_a_commit_record_makes_a_handle_of_its_store():
    h = BatchHandle.from_record(URL, _handle().record(), 1)
    assert h == _handle() and "store_url" not in _handle().record()
