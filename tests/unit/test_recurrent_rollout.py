"""The state of a recurrent policy in the rollout loops, without Dask: carried per env from
step to step and across batches and weights, reset where episodes start (in every autoreset
mode), and stored as ``policy_state`` and ``is_init``."""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest
import torch

from daskrl import PolicyError
from daskrl.config import CollectorConfig
from daskrl.testing import CountingEnv, CountingVectorEnv, StepCountPolicy, TagPolicy
from daskrl.worker._envs import EnvSpec
from daskrl.worker._recurrent import PolicyState
from daskrl.worker._rollout import EnvSet

CPU = torch.device("cpu")
MODES = ("NextStep", "SameStep", "Disabled")


def test_store_policy_state_is_validated():
    assert CollectorConfig().store_policy_state == "first"
    assert CollectorConfig(store_policy_state="every_step").as_dict()[
        "store_policy_state"] == "every_step"
    with pytest.raises(ValueError, match=re.escape(
            "store_policy_state must be 'first' or 'every_step', got 'all'.")):
        CollectorConfig(store_policy_state="all")



def _envsets(kind: str, every_step: bool = False, n: int = 3) -> EnvSet:
    mode = "every_step" if every_step else "first"
    if kind == "single":
        spec = EnvSpec(functools.partial(CountingEnv, 4))
    else:
        spec = EnvSpec(functools.partial(CountingVectorEnv, n, 2, kind), num_envs=n)
    return EnvSet(spec, n, seed=0, stream=0, store_policy_state=mode)


def check_counts(arrays: dict[str, np.ndarray], mapping: bool = False,
                 every_step: bool = False) -> None:
    """The counting policy's data: counts, stored state and is_init agree with ``step``."""
    step = arrays["step"]
    assert np.array_equal(arrays["count"], step + 1)
    assert np.array_equal(arrays["is_init"], step == 0)
    stored = arrays["policy_state/steps" if mapping else "policy_state"]
    expected = step if every_step else step[0]
    assert np.array_equal(stored if mapping else stored[..., 0], expected)
    if mapping:
        half = arrays["policy_state/half"]
        assert half.dtype == np.float32
        assert np.array_equal(half, np.repeat((expected / 2)[..., None], 2, -1))


@pytest.mark.parametrize("kind", ["single", *MODES])
@pytest.mark.parametrize("every_step", [False, True])
def test_state_is_carried_and_reset_per_env(kind, every_step):
    envset = _envsets(kind, every_step)
    policy = StepCountPolicy()
    starts = 0
    for b, T in enumerate([5, 4, 7]):
        if b == 2:
            policy = StepCountPolicy()  # new weights take over the carried state
        arrays, _ = envset.collect(policy, CPU, steps=T, batch_id=b)
        check_counts(arrays, every_step=every_step)
        assert arrays["policy_state"].shape == ((T, 3, 1) if every_step else (3, 1))
        assert arrays["policy_state"].dtype == np.int64
        starts += int(arrays["is_init"].sum())
        if b:  # a later batch continues episodes: its first rows are not all starts
            assert arrays["policy_state"].max() > 0
    assert starts > 3  # episodes started inside batches, not only at the stream's start


@pytest.mark.parametrize("kind", ["single", "NextStep", "SameStep"])
def test_a_mapping_state(kind):
    envset = _envsets(kind)
    for b in range(3):
        arrays, _ = envset.collect(StepCountPolicy(mapping=True), CPU, steps=5, batch_id=b)
        check_counts(arrays, mapping=True)
        assert "policy_state" not in arrays


def test_random_frames_advance_the_state():
    envset = _envsets("single")
    arrays, _ = envset.collect(StepCountPolicy(), CPU, steps=6, batch_id=0, random_steps=6)
    check_counts(arrays)
    arrays, _ = envset.collect(StepCountPolicy(), CPU, steps=6, batch_id=1, random_steps=3)
    check_counts(arrays)


def test_a_reset_of_the_envs_restarts_from_the_initial_state():
    envset = _envsets("NextStep")
    envset.collect(StepCountPolicy(), CPU, steps=5, batch_id=0)
    arrays, _ = envset.collect(StepCountPolicy(), CPU, steps=5, batch_id=1, reset=True)
    check_counts(arrays)
    assert not arrays["policy_state"].any() and arrays["is_init"][0].all()


def test_stateless_batches_do_not_change():
    arrays, _ = _envsets("single").collect(TagPolicy(), CPU, steps=4, batch_id=0)
    assert not {"policy_state", "is_init"} & set(arrays)


def test_a_state_whose_shape_changes_on_a_worker_is_named():
    class Shrinks(StepCountPolicy):
        def initial_state(self, num_envs):
            return torch.zeros(num_envs, 1 + self.calls, dtype=torch.int64)

        calls = 0

    envset = _envsets("single")
    policy = Shrinks()
    envset.collect(policy, CPU, steps=3, batch_id=0)
    policy.calls = 1
    with pytest.raises(PolicyError, match="a state keeps its shape and dtype from weights "
                                          "version to version"):
        envset.collect(policy, CPU, steps=3, batch_id=1)


def test_policy_state_reset_rows():
    state = PolicyState(7)
    policy = OffsetCountPolicy()
    state.begin(policy, CPU, steps=2)
    act = state.bind(policy)
    with torch.inference_mode():
        act(torch.zeros(7, 2))
        act(torch.zeros(7, 2))
    state.reset([1])
    assert state.state[:, 0].tolist() == [102, 100, 102, 102, 102, 102, 102]
    state.reset(np.array([0, 6]))
    assert state.state[:, 0].tolist() == [100, 100, 102, 102, 102, 102, 100]
    with torch.inference_mode():
        act(torch.zeros(7, 2))
    state.reset(np.arange(2, 7))  # more rows than are copied one by one
    assert state.state[:, 0].tolist() == [101, 101, 100, 100, 100, 100, 100]


class OffsetCountPolicy(StepCountPolicy):
    """A :class:`StepCountPolicy` whose state counts from 100: a stored state that was never
    taken from the policy's rows (an array's zeros) shows."""

    def initial_state(self, num_envs):
        return torch.full((num_envs, 1), 100, dtype=torch.int64)


@pytest.mark.parametrize("length", [3, 4, 5])
def test_a_staggered_batch_stores_each_columns_state_before_its_first_row(length):
    # NEXT_STEP sub-envs of episodes 2, 3 and 4 steps long: columns fall out of step, start
    # batches with spilled rows (past the next batch too), or with their reset step (their
    # first row made at t = 1). The stream's batches have one length, its last one less.
    envset = _envsets("NextStep")
    assert envset.staggered
    for b, T in enumerate([length] * 12 + [2]):
        arrays, _ = envset.collect(OffsetCountPolicy(), CPU, steps=T, batch_id=b)
        step = arrays["step"]
        assert np.array_equal(arrays["count"], step + 101)
        assert np.array_equal(arrays["policy_state"][:, 0], step[0] + 100)
        assert np.array_equal(arrays["is_init"], step == 0)


@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_dict_observations(mode):
    spec = EnvSpec(functools.partial(CountingVectorEnv, 3, 2, mode, dict_obs=True), num_envs=3)
    envset = EnvSet(spec, 3, seed=0, stream=0)
    for b in range(3):
        arrays, _ = envset.collect(StepCountPolicy(), CPU, steps=5, batch_id=b)
        assert "observation/count" in arrays
        check_counts(arrays)


@pytest.mark.parametrize("lengths", [
    [6, 6, 6, 2, 2, 2, 6, 6],  # longer, then shorter (a last batch or a requeued one), back
    [2] * 12 + [3, 3, 3],  # shorter, then longer
    [5, 5, 5, 5, 5, 5, 5, 1, 4, 3],  # a batch shorter than the spill, then others
], ids=["longer-shorter", "shorter-longer", "mixed"])
@pytest.mark.parametrize("every_step", [False, True])
def test_a_staggered_stream_whose_batch_length_changes_stores_each_columns_state(
        lengths, every_step):
    # NEXT_STEP sub-envs of episodes 2, 3 and 4 steps long: the column of 4-step episodes
    # runs ahead of the others and spills more rows than a batch of another length holds.
    # Every stored state must be the one before its column's first row in the batch.
    envset = _envsets("NextStep", every_step)
    spilled_past_a_batch = False
    for b, T in enumerate(lengths):
        if b and lengths[b - 1] != T:
            spilled_past_a_batch |= bool(envset._staggered._carry_n.max() > T)
        arrays, _ = envset.collect(OffsetCountPolicy(), CPU, steps=T, batch_id=b)
        step = arrays["step"]
        assert np.array_equal(arrays["count"], step + 101)
        expected = step if every_step else step[0]
        assert np.array_equal(arrays["policy_state"][..., 0], expected + 100), (b, T)
        assert np.array_equal(arrays["is_init"], step == 0)
    assert spilled_past_a_batch
