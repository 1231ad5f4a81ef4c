"""The learner's checks of a recurrent policy's contract, without Dask: each way to break it
is a PolicyError that says what to change."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch import nn

from daskrl import PolicyError
from daskrl.collect._checks import check_policy_output
from daskrl.testing import CountingEnv, GRUPolicy, StepCountPolicy, TagPolicy
from daskrl.worker._envs import EnvSpec
from daskrl.worker._recurrent import is_recurrent

OBS = spaces.Box(-np.inf, np.inf, (2,), np.float32)
ACT = spaces.Discrete(2)


def _check(policy: nn.Module, n: int = 3) -> None:
    check_policy_output(policy, EnvSpec(CountingEnv), OBS, ACT, n)


class _NoStateArg(nn.Module):
    def initial_state(self, n):
        return torch.zeros(n, 4)

    def forward(self, obs):
        return torch.zeros(obs.shape[0], dtype=torch.int64)


class _Recurrent(nn.Module):
    """Returns ``step(state)`` as the new state (and action 0), from ``init(n)``."""

    def __init__(self, init, step, one_value: bool = False) -> None:
        super().__init__()
        self.init, self.step, self.one_value = init, step, one_value

    def initial_state(self, n):
        return self.init(n)

    def forward(self, obs, state):
        action = torch.zeros(obs.shape[0], dtype=torch.int64)
        return action if self.one_value else (action, self.step(state))


def test_detection_needs_initial_state():
    assert is_recurrent(StepCountPolicy()) and is_recurrent(GRUPolicy(2, 2))
    assert not is_recurrent(TagPolicy())


def test_valid_recurrent_policies_pass_the_checks():
    _check(StepCountPolicy())
    _check(StepCountPolicy(mapping=True))
    _check(GRUPolicy(2, 2))


def test_initial_state_without_a_state_argument_is_refused():
    with pytest.raises(PolicyError, match=re.escape(
            "the policy _NoStateArg has initial_state(), so it is taken as recurrent, but its "
            "forward takes no state argument.")):
        _check(_NoStateArg())


def test_a_forward_that_returns_one_value_is_refused():
    policy = _Recurrent(lambda n: torch.zeros(n, 4), lambda s: s, one_value=True)
    with pytest.raises(PolicyError, match=re.escape(
            "the policy's forward(obs, state) returned tensor (3,) torch.int64 on cpu at its "
            "first step, one value where two were expected.")):
        _check(policy)


@pytest.mark.parametrize("init, message", [
    (lambda n: torch.zeros(4, n + 1),
     "the policy's initial_state(3) gave a state of shape (4, 4): a state has the envs first, "
     "[num_envs, ...] = (3, ...)."),
    (lambda n: torch.zeros(()), "gave a state of shape ()"),
    (lambda n: [torch.zeros(n)], "the policy's initial_state(3) is a list; a policy's state "
                                 "is a tensor [num_envs, ...] or a non-empty mapping"),
    (lambda n: {"not a name": torch.zeros(n)}, "is a mapping with the key 'not a name'"),
    (lambda n: torch.zeros(n, dtype=torch.complex64), "of dtype torch.complex64"),
])
def test_a_bad_initial_state_is_refused(init, message):
    with pytest.raises(PolicyError, match=re.escape(message)):
        _check(_Recurrent(init, lambda s: s))


def test_a_new_state_of_another_shape_or_dtype_is_refused():
    with pytest.raises(PolicyError, match=re.escape(
            "the new state forward(obs, state) returned at its first step has a state of shape "
            "(3, 4) and dtype torch.float64, but initial_state(3) gave shape (3, 4) and dtype "
            "torch.float32: a state keeps its shape and dtype from step to step.")):
        _check(_Recurrent(lambda n: torch.zeros(n, 4), lambda s: s.double()))
    with pytest.raises(PolicyError, match=re.escape("but initial_state(3) gave entries ['h']")):
        _check(_Recurrent(lambda n: {"h": torch.zeros(n, 4)}, lambda s: {"c": s["h"]}))


def test_a_state_that_changes_between_steps_is_refused():
    # the first step keeps the shape; the second grows it
    def grow(s):
        return torch.cat([s, s], 1) if s.sum() > 0 else s + 1

    with pytest.raises(PolicyError, match=re.escape(
            "the new state forward(obs, state) returned at its second step has a state of "
            "shape (3, 4)")):
        _check(_Recurrent(lambda n: torch.zeros(n, 2), grow))


def test_reserved_names_cannot_be_extra_outputs():
    class Named(nn.Module):
        def forward(self, obs):
            n = obs.shape[0]
            return {"action": torch.zeros(n, dtype=torch.int64), "is_init": torch.zeros(n)}

    with pytest.raises(PolicyError, match="extra output named 'is_init'"):
        _check(Named())
