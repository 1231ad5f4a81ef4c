"""The bytes on disk do not change: containers written now are those daskrl wrote before the
format code was restructured (issue 13), and the reader's boundary works over any byte source.

The digests were computed with the code of the ``move`` branch (before the restructuring), then
again for format 2.1 (issue 16), whose containers differ from 2.0's only in the arrays'
``dimension_names`` (every member compared, the 2.0 digests reproduced first), and again when
the batch group's ``zarr.json`` went onto one line (issue 14: the old digests reproduced with
the indented group document, so nothing else changed); they depend on
numcodecs' zstd and blosc output, which a numcodecs upgrade may change (then check the new
bytes with the zarr-python test of ``test_zip_container.py`` and update them).
"""

from __future__ import annotations

import hashlib
import re

import numpy as np
import pytest
from sample_batches import sample_arrays, sample_meta

from daskrl import StoreFormatError
from daskrl.config import Compression
from daskrl.store import TrajectoryStore
from daskrl.store._format import (
    BytesSource,
    ChunkRead,
    FileSource,
    ShortReadError,
    encode_batch,
    read_batch,
    read_index,
)
from daskrl.store._format.codec_choice import CodecChoices
from daskrl.store._format.read import plan_reads

BEFORE = {
    "zstd": (9247, "a45fcd425ca8c92d5193ae5a1ba53338e088955686e0fd51f21be751a457780a"),
    "lz4": (9954, "ad9dc669a51bf747d1cbb0663473e632f1877779d3b672265f5a94c2f6a4ccb7"),
    "none": (8657, "99677bd7d8da0dd35254eaffc4345504013b232d5af9b54147263e315ac1b3a4"),
}


def _batch() -> tuple[dict, dict]:
    arrays = sample_arrays(T=11, E=3)
    arrays["action"] = np.arange(33, dtype=">i8").reshape(11, 3).astype(np.int64)
    arrays["pixels"] = (np.arange(11 * 3 * 5 * 4) % 251).astype(np.uint8).reshape(11, 3, 5, 4)
    attrs = {**sample_meta(T=11, E=3), "batch_id": 7,
             "path": "batches/000000000007-abcdef012345.zip"}
    return attrs, arrays


def _bytes(compression: str, chunk_bytes: int = 64) -> bytes:
    attrs, arrays = _batch()
    batch = encode_batch(attrs, arrays, Compression(compression), chunk_bytes=chunk_bytes)
    return b"".join(bytes(memoryview(p).cast("B")) for p in batch.parts())


@pytest.mark.parametrize("compression", ["zstd", "lz4", "none"])
def test_a_container_is_byte_identical_to_one_written_before_the_restructuring(compression):
    data = _bytes(compression)
    assert (len(data), hashlib.sha256(data).hexdigest()) == BEFORE[compression]


@pytest.mark.parametrize("compression", ["zstd", "lz4", "none"])
def test_the_writer_puts_exactly_the_encoded_bytes_in_a_local_store(tmp_path, compression):
    """Large batches are written member by member while CRCs are computed: same bytes."""
    rng = np.random.default_rng(0)
    arrays = {"observation": rng.standard_normal((64, 8, 2100)).astype(np.float32),  # 4.3 MB
              "reward": rng.standard_normal((64, 8)).astype(np.float32)}
    w = TrajectoryStore(str(tmp_path / "s"), read_only=False)
    w.initialize()
    path, _ = w.write_batch(3, arrays, sample_meta(64, 8), compression=compression)
    attrs = {**sample_meta(64, 8), "batch_id": 3, "path": path}
    # a fresh writer decides per array as a fresh CodecChoices does (random floats: raw)
    want = b"".join(bytes(memoryview(p).cast("B"))
                    for p in encode_batch(attrs, arrays, Compression(compression),
                                          choices=CodecChoices()).parts())
    assert (tmp_path / "s" / path).read_bytes() == want


def test_file_and_bytes_sources_read_the_same_arrays(tmp_path):
    _, arrays = _batch()
    data = _bytes("none")
    (tmp_path / "b.zip").write_bytes(data)
    for src in (FileSource(tmp_path, "b.zip", "batch b"), BytesSource(data, "batch b")):
        index = read_index(src, [])
        assert index.layouts == {} and index.arrays == sorted(arrays)
        got = read_batch(src, index, ["pixels", "reward"])
        src.close()
        assert set(got) == {"pixels", "reward"}
        np.testing.assert_array_equal(got["pixels"], arrays["pixels"])
        np.testing.assert_array_equal(got["reward"], arrays["reward"])


def test_asking_for_no_arrays_reads_nothing_and_is_not_called_damage():
    src = BytesSource(_bytes("zstd"), "batch b")
    assert read_batch(src, read_index(src, []), []) == {}  # keys=[]: not "the store is damaged"


def test_the_plan_names_every_chunk_in_file_order():
    src = BytesSource(_bytes("zstd"), "batch b")
    index = read_index(src)
    plan = plan_reads(index, index.arrays)
    assert all(isinstance(r, ChunkRead) for r in plan.reads) and not plan.fills
    assert [r.offset for r in plan.reads] == sorted(r.offset for r in plan.reads)
    pixels = [r for r in plan.reads if r.array == "pixels"]
    # 60 bytes a row, 64 per chunk: one row per chunk
    assert [r.key for r in pixels] == [f"pixels/c/{i}/0/0/0" for i in range(11)]
    assert all(r.length == r.member.end - r.member.offset for r in pixels)
    assert plan.nbytes == sum(a.nbytes for a in _batch()[1].values())


def test_a_truncated_container_in_memory_is_refused():
    data = _bytes("none")
    with pytest.raises(StoreFormatError, match=re.escape("batch b: its zip container is not "
                                                         "accepted: the end records describe")):
        read_index(BytesSource(data[100:], "batch b"))
    with pytest.raises(ShortReadError, match="lie past the end"):
        BytesSource(data).read_ranges([(len(data) - 4, 8)])
