"""Bad input to the Collector fails on the learner, before any cluster starts or any batch is
written. (The collection end to end, and the embedded cluster: tests/test_collector.py.)"""

from __future__ import annotations

import re

import pytest
import torch
from child_processes import children as _children

# The Collector's module imports distributed: here, at collection (the unit tier refuses a
# test that imports it first); no test here gets as far as starting a cluster.
from daskrl import Collector, ConfigError, EnvError, PolicyError
from daskrl.testing import ConstantPolicy


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"frames_per_batch": 100, "envs_per_worker": 8}, ConfigError,
     "frames_per_batch=100 is not a multiple of envs_per_worker=8"),
    ({"total_frames": 1001}, ConfigError, "total_frames=1001 is not a multiple of envs_per_worker=8"),
    ({"envs_per_worker": 0}, ConfigError, "envs_per_worker must be an integer >= 1, got 0."),
    ({"env": "CartPol-v1"}, EnvError, "could not make env 'CartPol-v1'"),
    ({"policy": ConstantPolicy(0.5)}, PolicyError, "has dtype torch.float32, but env 'CartPole-v1'"),
    ({"device": "gpu:7"}, ConfigError, "device 'gpu:7' is not a torch device"),
    ({"compression": "bzip"}, ConfigError, "compression must be one of"),
])
def test_bad_input_fails_before_any_cluster_starts(tmp_path, kwargs, error, message):
    args = {"env": "CartPole-v1", "policy": ConstantPolicy(0, torch.int64),
            "store": str(tmp_path / "s")} | kwargs
    before = _children()
    with pytest.raises(error, match=re.escape(message)):
        Collector(args.pop("env"), args.pop("policy"), args.pop("store"), **args)
    assert _children() <= before  # no cluster was started
    assert not (tmp_path / "s" / "batches").exists() or not any((tmp_path / "s" / "batches").iterdir())
