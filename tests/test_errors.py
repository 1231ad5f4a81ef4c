"""Bad input gives a DaskrlError that names what was wrong and what to do, raised early: full
filesystems, refused S3 credentials, misbehaving envs and policies on workers. (API arguments,
refused on the learner before anything starts: tests/unit/test_errors.py.)"""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

import daskrl
from daskrl import EnvError, PolicyError, StoreError, StoreURLError
from daskrl.store import TrajectoryStore
from daskrl.testing import CountingEnv, EnvVarPolicy, FaultyEnv, TagPolicy

sys.path.insert(0, str(Path(__file__).parent))
from sample_batches import sample_arrays, sample_meta

pytestmark = pytest.mark.timeout(300)


# -- 14: a full disk under the commit record; refused S3 credentials ------------------------------
def _fill(mnt: Path, leave: int) -> None:
    """Fill the filesystem at ``mnt`` until only ``leave`` bytes (whole pages) are free."""
    st = os.statvfs(mnt)
    free = st.f_bavail * st.f_frsize
    assert free > leave, (free, leave)
    with open(mnt / "filler", "wb") as f:
        f.write(b"\0" * (free - leave))
    st = os.statvfs(mnt)
    assert st.f_bavail * st.f_frsize == leave


def test_a_full_disk_under_the_commit_record_names_the_store(tmpfs, tmp_path):
    arrays, meta = sample_arrays(T=200, E=8), sample_meta(T=200, E=8)
    # The container's size, measured by writing the same batch elsewhere.
    probe = TrajectoryStore(str(tmp_path / "probe"), read_only=False)
    probe.initialize()
    path, _ = probe.write_batch(0, arrays, meta, daskrl.Compression.NONE)
    page = os.statvfs(tmpfs).f_frsize
    size = (tmp_path / "probe" / path).stat().st_size
    pages = -(-size // page)
    store = TrajectoryStore(str(tmpfs / "s"), read_only=False)
    store.initialize()
    _fill(tmpfs, pages * page)  # room for the container, none for its commit record
    with pytest.raises(StoreError) as info:
        store.write_batch(0, arrays, meta, daskrl.Compression.NONE)
    url = store.url
    assert str(info.value).startswith(
        f"cannot write the commit record of batch 0 (the batch was not committed; its container "
        f"was removed) in store {url!r} (OSError: [Errno {errno.ENOSPC}] No space left on device")
    assert str(info.value).endswith(
        "The store's filesystem is full: free space or use another store.")
    assert isinstance(info.value.__cause__, OSError)
    assert info.value.__cause__.errno == errno.ENOSPC
    assert list((tmpfs / "s" / "batches").glob("*.zip")) == []  # no orphan container
    os.unlink(tmpfs / "filler")
    assert daskrl.open_store(url).batch_ids() == []
    path, committed = store.write_batch(0, arrays, meta, daskrl.Compression.NONE)  # room again
    assert committed and daskrl.open_store(url).batch_ids() == [0]


def test_wrong_s3_credentials_name_the_store_and_what_to_check(s3_with_auth):
    url = f"s3://daskrl-auth/{uuid.uuid4().hex}"
    options = {"endpoint_url": s3_with_auth, "key": "wrong-key", "secret": "wrong-secret",
               "client_kwargs": {"region_name": "us-east-1"}}
    for action in (lambda: daskrl.open_store(url, options),
                   lambda: daskrl.Collector("CartPole-v1", TagPolicy(), url,
                                            storage_options=options)):
        with pytest.raises(StoreError) as info:
            action()
        # The server's own words (e.g. "Forbidden", or that the key id is unknown) in between.
        cause = info.value.__cause__
        assert isinstance(cause, PermissionError)
        assert str(info.value) == (
            f"cannot read 'zarr.json' in store {url!r}: access denied ({cause}). Check the "
            "credentials in storage_options (key/secret, token, profile) or the "
            "environment, and that they may read and write this prefix.")


def test_options_an_s3_backend_refuses_are_named(s3_with_auth):
    url = f"s3://daskrl-auth/{uuid.uuid4().hex}"
    options = {"endpoint_url": s3_with_auth, "key": "k", "secret": "s", "regoin": "x"}
    with pytest.raises(StoreURLError, match=re.escape(
            f"cannot read 'zarr.json' in store {url!r}: the fsspec backend refused its "
            "storage_options (") + r".*'regoin'.*" + re.escape(
            "). Check the option names ['endpoint_url', 'key', 'regoin', 'secret'] against the "
            "backend's documentation.")):
        daskrl.open_store(url, options)
    json.dumps(options)  # (plain JSON, as the CLI's --storage-options takes it)


# -- 15: env outputs and policies on workers -------------------------------------------------------
class IntFlagEnv(CountingEnv):
    """Returns ``terminated`` as the integer 0 or 1 (as some older envs do)."""

    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        return obs, r, np.int64(term), int(trunc), info


WHERE = r"\n\[worker tcp://127\.0\.0\.1:\d+, weights version 0\]$"


@pytest.mark.parametrize(("fault", "got"), [
    ("reward-none", "reward=None (NoneType)"),
    ("reward-vector", "reward of shape (2,) (ndarray)"),
    ("terminated-array", "terminated of shape (1,) (ndarray)"),
    ("terminated-str", "terminated='no' (str)"),
])
def test_wrong_step_outputs_name_env_step_worker_and_version(client, tmp_path, fault, got):
    # The 3rd step of the worker process: env index 0 at step 1 (2 envs step in turn).
    env = functools.partial(FaultyEnv, fault, at=3, token=uuid.uuid4().hex)
    todo = ("step() must return one real number as the reward; reduce a vector reward to one "
            "(e.g. gymnasium.wrappers.TransformReward)." if fault.startswith("reward") else
            "step() must return terminated and truncated as bools (True/False).")
    pattern = (re.escape(f"env factory daskrl.testing.FaultyEnv (env index 0) returned from "
                         f"step() {got} at step 1 of batch ") + r"\d+" +
               re.escape(f": {todo} Fix the env; the batch was discarded.") + WHERE)
    with (
        daskrl.Collector(env, TagPolicy(), str(tmp_path / "s"), client=client, num_workers=1,
                         envs_per_worker=2, frames_per_batch=8, total_frames=32) as c,
        pytest.raises(EnvError) as info,
    ):
        list(c)
    assert re.fullmatch(pattern, str(info.value)), str(info.value)
    assert daskrl.open_store(str(tmp_path / "s")).batch_ids() == []  # nothing stored from it


def test_integer_flags_are_stored_as_bools(inproc_client, tmp_path):
    env = functools.partial(IntFlagEnv, 3)
    with daskrl.Collector(env, TagPolicy(), str(tmp_path / "s"), client=inproc_client,
                          num_workers=1, envs_per_worker=2, frames_per_batch=12,
                          total_frames=12) as c:
        (handle,) = list(c)
    b = handle.load()
    assert b["terminated"].dtype == torch.bool
    assert b["terminated"][:, 0].tolist() == [False, False, True, False, False, True]


def test_a_policy_that_raises_only_on_workers_is_named(client, tmp_path, monkeypatch):
    # Set here, after the workers started: the learner's check passes, the workers' step fails.
    monkeypatch.setenv("DASKRL_TEST_POLICY_VAR", "1")
    with (
        daskrl.Collector("daskrl.testing:Counting-v0", EnvVarPolicy(), str(tmp_path / "s"),
                         client=client, num_workers=1, envs_per_worker=2, frames_per_batch=8,
                         total_frames=32) as c,
        pytest.raises(PolicyError) as info,
    ):
        list(c)
    msg = str(info.value)
    assert re.match(re.escape("the policy raised at step 0 of batch ") + r"\d+" + re.escape(
        " on the observations of env 'daskrl.testing:Counting-v0' (tensor (2, 2) torch.float32 "
        "on cpu): KeyError('DASKRL_TEST_POLICY_VAR'). It ran on the learner's sample "
        "observations: check what differs on the worker"), msg), msg
    assert "--- the policy's traceback, on the worker ---\nTraceback" in msg
    assert "os.environ[self.name]" in msg  # the line that raised
    assert re.search(WHERE, msg), msg
