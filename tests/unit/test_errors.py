"""Bad API arguments give a DaskrlError that names what was wrong and what to do, raised on the
learner before the env is built, a store is opened or any cluster starts. (Full filesystems,
refused S3 credentials, misbehaving envs and policies on workers: tests/test_errors.py.)"""

from __future__ import annotations

import math
import re

import gymnasium as gym
import pytest
import torch

import daskrl

# The Collector's module imports distributed: here, at collection (the unit tier refuses a
# test that imports it first); no test here gets as far as starting a cluster.
from daskrl import Collector, ConfigError, DaskrlError, PolicyError, StoreURLError
from daskrl.testing import TagPolicy


class _Probed:
    """An env factory that records being called: the learner probes the env before it opens
    the store or starts a cluster, so an error raised with ``calls == 0`` came first."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> gym.Env:
        self.calls += 1
        return gym.make("CartPole-v1")


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
        Collector(env, TagPolicy(), store, storage_options=options)
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
        Collector(env, TagPolicy(), str(tmp_path / "s"), **{name: value})
    assert f"got {value!r}." in str(info.value)
    assert env.calls == 0 and not (tmp_path / "s").exists()


def test_good_timeouts_are_accepted():
    config = daskrl.CollectorConfig(batch_timeout=2.5)
    assert config.batch_timeout == 2.5
    assert daskrl.CollectorConfig(batch_timeout=None).batch_timeout is None


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
        Collector("CartPole-v1", _ExtrasPolicy(extras), str(tmp_path / "s"),
                         envs_per_worker=4, frames_per_batch=16)
    assert psutil.Process().children(recursive=True) == children  # no cluster was started
    assert not (tmp_path / "s").exists()
