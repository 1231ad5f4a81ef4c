"""Recurrent policies collected on in-process clusters: the stored state and ``is_init`` agree
exactly with the steps of every episode, across the batches of each stream and weights
updates, sync and async, single and vector envs in each autoreset mode; a replay from the
stored state reproduces the stored outputs; and a broken contract fails before any worker
runs a batch."""

from __future__ import annotations

import functools
import os
import re

import numpy as np
import pytest
import torch
import zarr
from torch import nn
from zarr.storage import ZipStore

import daskrl
import daskrl.testing
from daskrl import PolicyError
from daskrl.testing import CountingVectorEnv, GRUPolicy, StepCountPolicy

COUNTING = "daskrl.testing:Counting-v0"  # episodes of 5 steps


def _numpy(batch):
    return {k: ({n: t.numpy() for n, t in v.items()} if isinstance(v, dict) else v.numpy())
            for k, v in batch.items()}


def check_counts(batch, state, every_step=False):
    """``count == step + 1``, ``is_init == (step == 0)``, and the stored ``state`` is the
    step count before the batch's first step (or before each step)."""
    step = batch["step"]
    assert np.array_equal(batch["count"], step + 1)
    assert np.array_equal(batch["is_init"], step == 0)
    if state.ndim > (step.ndim if every_step else 1):
        state = state[..., 0]
    assert np.array_equal(state, step if every_step else step[0])


def _collect(client, tmp_path, env=COUNTING, policy=None, *, updates=True, **options):
    policy = policy or StepCountPolicy()
    options = {"num_workers": 2, "envs_per_worker": 3, "frames_per_batch": 21,
               "total_frames": 21 * 6, **options}
    url = str(tmp_path / "s")
    handles = []
    with daskrl.Collector(env, policy, url, client=client, **options) as c:
        for h in c:
            handles.append(h)
            if updates and len(handles) % 2 == 0:
                with torch.no_grad():
                    policy.tag.fill_(c.weights_version + 1)
                c.update_weights(policy)
    return url, handles


@pytest.mark.parametrize("rounds", [True, False])
def test_state_counts_steps_across_batches_and_weights(inproc_client, tmp_path, rounds):
    _, handles = _collect(inproc_client, tmp_path, rounds=rounds)
    assert len(handles) == 6
    carried = versions = 0
    for h in handles:
        b = _numpy(h.load())
        check_counts(b, b["policy_state"])
        assert b["policy_state"].shape == (3, 1) and b["policy_state"].dtype == np.int64
        assert b["is_init"].dtype == np.bool_ and b["is_init"].shape == (7, 3)
        carried += int((b["policy_state"] > 0).sum())  # episodes continued into the batch
        versions = max(versions, h.weights_version)
        assert np.all(b["tag"] == h.weights_version)
    assert carried > 0 and versions >= 1


def test_several_envs_each_carry_their_own_state(inproc_client, tmp_path):
    # two envs whose episodes end at different steps (3 and 5), one per stream: each stream's
    # state counts its own env's steps, across its batches
    envs = [functools.partial(daskrl.testing.CountingEnv, length=3),
            functools.partial(daskrl.testing.CountingEnv, length=5)]
    _, handles = _collect(inproc_client, tmp_path, env=envs, updates=False, num_workers=2)
    assert {h.env for h in handles} == {0, 1}
    for h in handles:
        b = _numpy(h.load())
        check_counts(b, b["policy_state"])
        assert b["step"].max() == (2, 4)[h.env]  # the env's own episodes, not the other's


@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled"])
def test_vector_envs_in_each_autoreset_mode(inproc_client, tmp_path, mode):
    env = functools.partial(CountingVectorEnv, 3, 2, mode)
    _, handles = _collect(inproc_client, tmp_path, env, rounds=False)
    starts = 0
    for h in handles:
        b = _numpy(h.load())
        check_counts(b, b["policy_state"])
        starts += int(b["is_init"][1:].sum())
    assert starts > 0  # episodes began inside batches: their rows were reset there


def test_mapping_state_every_step_read_with_zarr_alone(inproc_client, tmp_path):
    url, handles = _collect(inproc_client, tmp_path, policy=StepCountPolicy(mapping=True),
                            store_policy_state="every_step", updates=False)
    for h in handles:
        b = _numpy(h.load())
        check_counts(b, b["policy_state"]["steps"], every_step=True)
        assert b["policy_state"]["half"].shape == (7, 3, 2)
        assert np.array_equal(b["policy_state"]["half"][..., 0], b["step"] / 2)
    h = handles[-1]
    with ZipStore(os.path.join(url, h.path), mode="r") as container:
        group = zarr.open_group(container, mode="r")
        steps = group["policy_state/steps"]
        assert steps.metadata.dimension_names == ("time", "env")
        assert np.array_equal(steps[...], h.load()["policy_state"]["steps"].numpy())
        assert np.array_equal(group["is_init"][...], h.load()["step"].numpy() == 0)
        assert group.attrs["policy_state"] == "every_step"
    assert daskrl.open_store(url).runs()[0]["settings"]["store_policy_state"] == "every_step"


def test_first_state_is_env_major_with_zarr_alone(inproc_client, tmp_path):
    url, handles = _collect(inproc_client, tmp_path, updates=False, total_frames=42)
    h = handles[-1]
    with ZipStore(os.path.join(url, h.path), mode="r") as container:
        group = zarr.open_group(container, mode="r")
        state = group["policy_state"]
        assert state.shape == (3, 1)
        assert state.metadata.dimension_names == ("env", "policy_state_0")
        assert np.array_equal(state[...], h.load()["policy_state"].numpy())
        assert group.attrs["policy_state"] == "first"


def test_gru_replay_from_the_stored_state_reproduces_the_outputs(inproc_client, tmp_path):
    torch.manual_seed(0)
    policy = GRUPolicy(2, 2, hidden=8)
    _, handles = _collect(inproc_client, tmp_path, policy=policy, updates=False,
                          init_random_frames=9)
    replayed = 0
    for h in handles:
        b = h.load()
        h_t = b["policy_state"].clone()
        init = policy.initial_state(3)
        with torch.no_grad():
            for t in range(b["step"].shape[0]):
                reset = b["is_init"][t]
                h_t[reset] = init[reset]
                out, h_t = policy(b["observation"][t], h_t)
                assert torch.equal(out["logits"], b["logits"][t]), (h.batch_id, t)
                replayed += 1
    assert replayed == 6 * 7


class _GrowingState(nn.Module):
    def initial_state(self, n):
        return torch.zeros(n, 1)

    def forward(self, obs, state):
        new = state + 1 if state.shape[1] == 1 and not state.any() else torch.cat([state] * 2, 1)
        return torch.zeros(obs.shape[0], dtype=torch.int64), new


def test_a_broken_contract_fails_before_any_worker_runs_a_batch(inproc_client, tmp_path):
    url = str(tmp_path / "s")
    with pytest.raises(PolicyError, match=re.escape(
            "the new state forward(obs, state) returned at its second step has a state of "
            "shape (3, 2)")):
        daskrl.Collector(COUNTING, _GrowingState(), url, client=inproc_client, num_workers=2,
                         envs_per_worker=3, frames_per_batch=21, total_frames=42)
    assert not os.path.exists(url)  # checked before the store was even made
    plugins = inproc_client.run(lambda dask_worker: [
        type(p).__name__ for p in dask_worker.plugins.values()])
    assert len(plugins) == 2 and not any("CollectorPlugin" in p for p in plugins.values())


def test_a_restarted_stream_starts_from_the_initial_state(inproc_client, tmp_path):
    from daskrl.testing import FaultyEnv

    env = functools.partial(FaultyEnv, "raise", at=30, once=True, length=5,
                            token=str(tmp_path))
    _, handles = _collect(inproc_client, tmp_path, env, updates=False, num_workers=1,
                          on_env_error="restart")
    restarted = [h for h in handles if h.env_restarts]
    assert [h.batch_id for h in restarted] == [handles[1].batch_id]
    for h in handles:
        b = _numpy(h.load())
        check_counts(b, b["policy_state"])
    b = _numpy(restarted[0].load())
    assert b["is_init"][0].all() and not b["policy_state"].any()
    assert _numpy(handles[2].load())["policy_state"].any()  # carried again after it
