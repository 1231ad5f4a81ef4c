"""The per-host copy of Dask-sent weights (daskrl.weights._host_copies.HostCopies), on real
files, in this process. (Copies and locks of dead or killed workers, made by real processes:
tests/test_host_copies.py.)"""

from __future__ import annotations

import os

import pytest
from tag_policies import tag_policy as _policy

from daskrl import WeightsIntegrityError
from daskrl.weights import snapshot
from daskrl.weights._host_copies import HostCopies
from daskrl.weights._shared_reader import SharedWeightsReader


@pytest.mark.timeout(60)
def test_one_worker_makes_the_copy_the_others_read_it(tmp_path):
    maker, reader = HostCopies("c1", directory=str(tmp_path)), HostCopies("c1", directory=str(tmp_path))
    assert maker.manifest("v3", wait=False) is None
    assert maker.claim("v3")
    assert not reader.claim("v3")  # held by a live process (this one)
    maker.publish("v3", snapshot(_policy(7.0), 3))
    manifest = reader.manifest("v3", wait=True)
    assert manifest is not None and manifest.version == 3
    target = _policy(0.0)
    SharedWeightsReader().load(target, manifest)
    assert target.tag.item() == 7.0
    # Only the newest `keep` copies stay; closing removes the rest.
    for v in range(4, 8):
        assert maker.claim(f"v{v}")
        maker.publish(f"v{v}", snapshot(_policy(v), v))
    assert reader.manifest("v3", wait=False) is None
    assert reader.manifest("v7", wait=False) is not None
    maker.close()
    assert not [n for n in os.listdir(tmp_path) if "c1" in n]


@pytest.mark.timeout(60)
def test_a_worker_that_claims_after_the_copy_was_made_reads_it_instead(tmp_path):
    """Worker B finds no copy of v2, then worker A makes it and releases its lock, then B
    claims: B gets no claim, reads A's copy, and the host fetches v2 once, not twice."""
    a, b = HostCopies("c6", directory=str(tmp_path)), HostCopies("c6", directory=str(tmp_path))
    assert b.manifest("v2", wait=False) is None  # B looks: nothing yet
    assert a.claim("v2")
    a.publish("v2", snapshot(_policy(2.0), 2))  # A makes the copy; its lock is released
    assert not (tmp_path / "daskrl-host-c6-v2.lock").exists()
    assert not b.claim("v2")
    assert not (tmp_path / "daskrl-host-c6-v2.lock").exists()  # B's try left no lock
    copy = b.manifest("v2", wait=True)
    assert copy is not None and copy.version == 2
    # a manifest whose segment is gone (its maker was killed) is no reason to refuse a claim
    os.unlink(copy.path)
    assert b.claim("v2")
    b.release("v2")
    a.close()


@pytest.mark.timeout(60)
def test_a_changed_byte_in_the_host_copy_is_refused(tmp_path):
    copies = HostCopies("c3", directory=str(tmp_path))
    assert copies.claim("v1")
    copies.publish("v1", snapshot(_policy(1.5), 1))
    manifest = copies.manifest("v1", wait=False)
    assert manifest is not None
    with open(manifest.path, "r+b") as f:
        f.seek(manifest.offsets[0])
        byte = f.read(1)
        f.seek(manifest.offsets[0])
        f.write(bytes([byte[0] ^ 0x10]))
    with pytest.raises(WeightsIntegrityError, match="tensor 'tag'"):
        SharedWeightsReader().load(_policy(0.0), manifest)
    copies.close()


@pytest.mark.timeout(60)
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="changing a file's owner needs root")
def test_a_copy_of_another_user_is_not_trusted(tmp_path):
    copies = HostCopies("c4", directory=str(tmp_path))
    assert copies.claim("v1")
    copies.publish("v1", snapshot(_policy(2.0), 1))
    os.chown(tmp_path / "daskrl-host-c4-v1.json", 65534, 65534)
    assert copies.manifest("v1", wait=False) is None
    copies.close()
