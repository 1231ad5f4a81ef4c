"""Devices and weights checked on the learner and resolved for a worker, without a cluster:
a policy holding tensor data outside its parameters and buffers is refused before any cluster
starts, and a worker's device follows the setting, then ``DASKRL_DEVICE``. (What every
spawn-started worker loaded, bit for bit: tests/test_devices_weights.py.)"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

# The Collector's module imports distributed: here, at collection (the unit tier refuses a
# test that imports it first); no test here gets as far as starting a cluster.
from daskrl import Collector, ConfigError, PolicyError
from daskrl.worker._devices import resolve_device


def test_plain_tensor_attributes_are_refused(tmp_path):
    class Sneaky(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 2)
            self.state_std = torch.ones(4)  # neither parameter nor buffer: would be pickled

        def forward(self, obs):
            return self.lin(obs / self.state_std).argmax(-1)

    with pytest.raises(PolicyError, match=re.escape("holds tensor data outside its parameters and buffers")):
        Collector("CartPole-v1", Sneaky(), str(tmp_path / "s"))


def test_resolve_device_order(monkeypatch):
    monkeypatch.delenv("DASKRL_DEVICE", raising=False)
    assert resolve_device("auto", "w0", "tcp://a") == torch.device("cpu")
    assert resolve_device({"w1": "cpu"}, "w0", "tcp://a") == torch.device("cpu")
    monkeypatch.setenv("DASKRL_DEVICE", "cpu")
    assert resolve_device("auto", "w0", "tcp://a") == torch.device("cpu")
    if not torch.cuda.is_available():
        monkeypatch.setenv("DASKRL_DEVICE", "cuda:1")  # the worker declares a GPU it lacks
        with pytest.raises(ConfigError, match=re.escape("worker w0 (tcp://a) was asked for device 'cuda:1'")):
            resolve_device("auto", "w0", "tcp://a")
        # an explicit setting wins over the declaration
        assert resolve_device("cpu", "w0", "tcp://a") == torch.device("cpu")
        assert resolve_device({"w0": "cpu"}, "w0", "tcp://a") == torch.device("cpu")
