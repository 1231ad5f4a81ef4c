"""The stream channel's messages as they cross a real ``distributed.comm`` serialization: a
handle and a batch travel as plain values and come back equal, field for field and type for
type; a batch's weights ref is left out only where the stream was told of it."""

from __future__ import annotations

import dataclasses

import pytest
from distributed.protocol import dumps, loads

from daskrl.errors import StreamError
from daskrl.store._handles import BatchHandle
from daskrl.weights._segments import SharedWeights
from daskrl.worker._stream import batch_message, read_batch
from daskrl.worker._tasks import BatchTask


def _through_comm(msg):
    return loads(dumps(msg))


def _handle(**changes) -> BatchHandle:
    h = BatchHandle(store_url="file:///tmp/s", batch_id=7, frames=64, weights_version=3,
                    policy_lag=1, worker="tcp://10.0.0.2:4000", device="cpu",
                    episode_returns=(1.5, 2.0), episode_lengths=(3, 4),
                    path="runs/0000/batches/0000000007.zip", shape=(8, 8),
                    rollout_seconds=0.01, write_seconds=0.002, env_restarts=1,
                    episode_stats=((1.5, 3, 0.1),), needs_options=True, env=2)
    return dataclasses.replace(h, **changes)


def test_a_handle_crosses_as_plain_values_and_comes_back_equal():
    h = _handle()
    got = BatchHandle.from_wire(_through_comm({"h": h.to_wire()})["h"])
    assert got == h
    for f in dataclasses.fields(BatchHandle):
        assert type(getattr(got, f.name)) is type(getattr(h, f.name)), f.name
    assert got.episode_stats == ((1.5, 3, 0.1),) and got._store_object is None
    with pytest.raises(ValueError, match="fields"):
        BatchHandle.from_wire(h.to_wire()[:-1])


def _task(version: int, weights) -> BatchTask:
    return BatchTask(batch_id=9, stream=2, previous_batch_id=None, steps=8, random_steps=1,
                     weights_version=version, weights=weights, env=1, newest_ok=True)


def test_a_batch_leaves_out_only_the_weights_its_stream_was_told_of():
    manifest = SharedWeights(version=4, names=("w",), dtypes=("torch.float32",),
                             shapes=((2, 3),), offsets=(64,), checksums=(123,),
                             path="/dev/shm/x", nonce=b"\x01" * 8, host="h")
    announced = (4, manifest)
    msg = _through_comm(batch_message(_task(4, manifest), announced))
    assert msg["w"] is None
    assert read_batch(msg, announced) == _task(4, manifest)
    # A version other than the announced one, or the same under another ref, travels along.
    for task in (_task(3, "key-3"), _task(4, "key-4")):
        msg = _through_comm(batch_message(task, announced))
        assert msg["w"] is not None and read_batch(msg, None) == task
    with pytest.raises(StreamError, match="not announced"):
        read_batch(_through_comm(batch_message(_task(4, manifest), announced)), (3, "k"))
