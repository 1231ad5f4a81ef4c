"""Bad input gives a DaskrlError that names what was wrong and what to do, raised early: API
arguments, full filesystems, refused S3 credentials, misbehaving envs and policies on workers."""

from __future__ import annotations

import errno
import functools
import json
import math
import os
import re
import sys
import uuid
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import daskrl
from daskrl import ConfigError, DaskrlError, EnvError, PolicyError, StoreError, StoreURLError
from daskrl.store import TrajectoryStore
from daskrl.testing import CountingEnv, EnvVarPolicy, FaultyEnv, TagPolicy

sys.path.insert(0, str(Path(__file__).parent))
from sample_batches import sample_arrays, sample_meta

pytestmark = pytest.mark.timeout(300)


class _Probed:
    """An env factory that records being called: the learner probes the env before it opens
    the store or starts a cluster, so an error raised with ``calls == 0`` came first."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> gym.Env:
        self.calls += 1
        return gym.make("CartPole-v1")


# -- 13: API arguments ----------------------------------------------------------------------------
@pytest.mark.parametrize(("store", "options", "error", "message"), [
    (None, None, StoreURLError, "store must be a local path or an fsspec URL (a non-empty str or "
                                "os.PathLike), got None. Pass e.g. store='runs/demo'"),
    (42, None, StoreURLError, "store must be a local path or an fsspec URL"),
    ("nosuchproto://bucket/run", None, StoreURLError,
     "store 'nosuchproto://bucket/run' names the unknown fsspec protocol 'nosuchproto'. Give a "
     "local path or a URL whose protocol fsspec knows (fsspec.available_protocols())."),
    ("s4://bucket/run", None, StoreURLError, "unknown fsspec protocol 's4'. Did you mean 's3://'"),
    ("memory://x", "anon=true", StoreURLError,
     "storage_options must be a mapping with string keys (fsspec options such as {'anon': "
     "True}) or None, got str 'anon=true'. Parse a JSON text first"),
    ("memory://x", {1: 2}, StoreURLError, "storage_options must be a mapping with string keys"),
    ("runs/local", {"anon": True}, StoreURLError,
     "is a local path, which takes no storage_options (they go to fsspec backends such as "
     "s3://), got ['anon']."),
])
def test_bad_store_arguments_fail_before_the_env_is_built(store, options, error, message):
    env = _Probed()
    with pytest.raises(error, match=re.escape(message)) as info:
        daskrl.Collector(env, TagPolicy(), store, storage_options=options)
    assert isinstance(info.value, DaskrlError) and isinstance(info.value, ValueError)
    assert env.calls == 0
    # Opening a store for reading says the same.
    with pytest.raises(error, match=re.escape(message)):
        daskrl.open_store(store, options)


@pytest.mark.parametrize(("name", "value"), [
    ("batch_timeout", math.nan), ("batch_timeout", math.inf), ("batch_timeout", True),
    ("batch_timeout", "10"), ("lost_workers_timeout", math.nan),
    ("lost_workers_timeout", True), ("lost_workers_timeout", math.inf),
    ("lost_workers_timeout", 0), ("lost_workers_timeout", None),
])
def test_bad_timeouts_fail_before_the_env_is_built(tmp_path, name, value):
    env = _Probed()
    with pytest.raises(ConfigError, match=re.escape(
            f"{name} must be a positive, finite number of seconds")) as info:
        daskrl.Collector(env, TagPolicy(), str(tmp_path / "s"), **{name: value})
    assert f"got {value!r}." in str(info.value)
    assert env.calls == 0 and not (tmp_path / "s").exists()


def test_good_timeouts_are_accepted():
    config = daskrl.CollectorConfig(batch_timeout=2.5)
    assert config.batch_timeout == 2.5
    assert daskrl.CollectorConfig(batch_timeout=None).batch_timeout is None


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


class _ExtrasPolicy(torch.nn.Module):
    def __init__(self, extras: dict) -> None:
        super().__init__()
        self.extras = extras

    def forward(self, obs: torch.Tensor) -> dict:
        n = obs.shape[0]
        return {"action": torch.zeros(n, dtype=torch.int64),
                **{k: f(n) for k, f in self.extras.items()}}


@pytest.mark.parametrize(("extras", "message"), [
    ({"reward": lambda n: torch.zeros(n)}, "the policy returned an extra output named 'reward'; "
     "extra outputs are stored under their own names, which must be identifiers other than"),
    ({"log prob": lambda n: torch.zeros(n)}, "extra output named 'log prob'"),
    ({"value": lambda n: torch.zeros(3, n)}, "policy output 'value' has shape (3, 4); per-step "
     "outputs must have the envs first: (4, ...)."),
])
def test_extra_outputs_are_checked_on_the_learner(tmp_path, extras, message):
    import psutil

    children = psutil.Process().children(recursive=True)
    with pytest.raises(PolicyError, match=re.escape(message)):
        daskrl.Collector("CartPole-v1", _ExtrasPolicy(extras), str(tmp_path / "s"),
                         envs_per_worker=4, frames_per_batch=16)
    assert psutil.Process().children(recursive=True) == children  # no cluster was started
    assert not (tmp_path / "s").exists()
