"""Weights through the store (``weights_in_store=True``), on a real LocalCluster and store.

The learner writes each version once under ``runs/weights-<collector>/``; the first worker of
the host to need it reads it from there and the host's other worker reads its copy in shared
memory; the scheduler carries no version. A file changed, replaced by a link, or gone is
refused with a clear error, and what was committed stays. (Across namespace hosts:
``tests/test_hosts.py``.)
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch

import daskrl
from daskrl import WeightsIntegrityError, WeightsUnavailableError
from daskrl.testing import TagPolicy

COUNTING = "daskrl.testing:Counting-v0"


def _options(batches: int, **extra) -> dict:
    return {"envs_per_worker": 2, "frames_per_batch": 40, "total_frames": 40 * batches,
            "weights_in_store": True, **extra}


def _weights_files(store: str, collector: daskrl.Collector) -> list[str]:
    d = os.path.join(store, "runs", f"weights-{collector._id}")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def _publish_tag(collector: daskrl.Collector, policy: TagPolicy) -> int:
    """Publish a new version whose output ``tag`` is that version's number."""
    with torch.no_grad():
        policy.tag.fill_(collector.weights_version + 1)
    return collector.update_weights(policy)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rounds", [True, False])
def test_versions_reach_the_policy_through_the_store_once_per_host(client, tmp_path, rounds):
    store = str(tmp_path / "store")
    policy = TagPolicy()
    seen: list[tuple[int, int]] = []
    # Async with one batch in flight per stream: a batch's version is at most one behind the
    # newest, so each worker still holds its copy of every version a batch needs (it keeps its
    # newest 3); with more in flight a delayed batch may rightly read an evicted one again.
    options = _options(12, rounds=rounds, **({} if rounds else {"batches_in_flight": 1}))
    with daskrl.Collector(COUNTING, policy, store, client=client, **options) as c:
        assert c.weights_transport == "store"
        for handle in c:
            seen.append((handle.batch_id, handle.weights_version))
            # only versions that a batch in flight may still need, and the newest, are in the
            # store (not one file per version published)
            files = _weights_files(store, c)
            assert 1 <= len(files) <= 2 * c.num_streams + 1, files
            assert any(f.startswith(f"v{c.weights_version}-") for f in files), files
            _publish_tag(c, policy)
        name = c.plugin_name
        sources = client.run(lambda dask_worker: dask_worker.plugins[name].weight_sources)
        assert not client.list_datasets()  # no version went through the scheduler
        collector = c
    assert _weights_files(store, collector) == []  # removed at close
    assert sorted(os.listdir(os.path.join(store, "runs"))) == ["0000", "zarr.json"]
    by_version: dict[int, list[str]] = {}
    for loaded in sources.values():
        for version, source in loaded:
            by_version.setdefault(version, []).append(source)
    assert len(by_version) >= 3, by_version
    for version, got in by_version.items():
        # one host: one read from the store per version, the other worker reads its copy
        assert got.count("store") == 1 and set(got) <= {"store", "host-copy"}, (version, got)
    s = daskrl.open_store(store)
    assert s.frames == 40 * 12 and sorted(b for b, _ in seen) == s.batch_ids()
    for batch_id, version in seen:  # each step computed by the version its batch names
        assert (s.load(batch_id, keys=["tag"])["tag"] == version).all(), (batch_id, version)


def _flip_a_tensor_byte(path: str, outside: str) -> None:
    with open(path, "r+b") as f:
        f.seek(64)  # the first tensor's first byte
        b = f.read(1)
        f.seek(64)
        f.write(bytes([b[0] ^ 0x01]))


def _link_to_a_copy_outside(path: str, outside: str) -> None:
    """The same bytes, but in a file outside the store that the store's file now links to."""
    shutil.copyfile(path, outside)
    os.unlink(path)
    os.symlink(outside, path)


def _truncate(path: str, outside: str) -> None:
    os.truncate(path, os.path.getsize(path) - 4)


def _remove(path: str, outside: str) -> None:
    os.unlink(path)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("damage", "error", "message"), [
    (_flip_a_tensor_byte, WeightsIntegrityError, "its bytes in the store were changed"),
    (_link_to_a_copy_outside, WeightsIntegrityError, "symbolic link"),
    (_truncate, WeightsIntegrityError, "where the learner wrote"),
    (_remove, WeightsUnavailableError, "is missing"),
])
def test_a_damaged_version_in_the_store_is_refused_and_the_batches_stay(
        client, tmp_path, damage, error, message):
    store = str(tmp_path / "store")
    policy = TagPolicy()
    with daskrl.Collector(COUNTING, policy, store, client=client, **_options(8)) as c:
        first = c.hand_over(c.submit().result())
        assert first.weights_version == 0
        version = _publish_tag(c, policy)  # no worker has loaded it yet
        [name] = [f for f in _weights_files(store, c) if f.startswith(f"v{version}-")]
        damage(os.path.join(store, "runs", f"weights-{c._id}", name), str(tmp_path / "outside"))
        with pytest.raises(error, match=message) as info:
            c.submit().result()
        assert name in str(info.value) and f"weights version {version}" in str(info.value)
        # a good version after it is loaded as usual
        good = _publish_tag(c, policy)
        handle = c.hand_over(c.submit().result())
        assert handle.weights_version == good
        assert (handle.load(keys=["tag"])["tag"] == good).all()
    s = daskrl.open_store(store)
    assert first.batch_id in s.batch_ids() and handle.batch_id in s.batch_ids()
    assert (s.load(first.batch_id, keys=["tag"])["tag"] == 0).all()
