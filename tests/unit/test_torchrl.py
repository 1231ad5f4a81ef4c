"""TensorDict and TorchRL views of real batches (rollouts of real envs, in a store on disk),
without Dask; the comparison with TorchRL's own collectors and its replay buffers and losses
are in tests/test_torchrl.py (importing torchrl costs more than this tier's budget allows)."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest
import torch

from daskrl import MissingDependencyError, UsageError
from daskrl.integrations.torchrl import extend_replay_buffer, to_tensordict, to_torchrl
from daskrl.store import TrajectoryStore
from daskrl.testing import CountingEnv
from daskrl.worker._envs import EnvSpec
from daskrl.worker._rollout import EnvSet

T, E, LENGTH = 7, 3, 4
INSTALL = 'pip install "daskrl[torchrl]"'


class _ParityPolicy(torch.nn.Module):
    """Action: the parity of the step within the episode; extra output ``tag``: the episode."""

    def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"action": obs[:, 1].long() % 2, "tag": obs[:, 0].clone()}


def _store(tmp_path, batches: int = 2, max_steps: int | None = None) -> TrajectoryStore:
    """A store of ``batches`` real rollouts of CountingEnv (episodes of LENGTH steps, across
    batch boundaries; truncated at ``max_steps``) with the policy's extra output ``tag``."""
    store = TrajectoryStore(str(tmp_path / "s"), read_only=False)
    store.initialize()
    envset = EnvSet(EnvSpec(lambda: CountingEnv(LENGTH), max_episode_steps=max_steps),
                    n_envs=E, seed=0, stream=0)
    for b in range(batches):
        arrays, _ = envset.collect(_ParityPolicy(), torch.device("cpu"), steps=T, batch_id=b)
        meta = {"frames": T * E, "weights_version": 0, "worker": "w", "device": "cpu",
                "episode_returns": [], "episode_lengths": [], "shape": [T, E]}
        assert store.write_batch(b, arrays, meta)[1]
    store.refresh()
    return store


def test_to_tensordict_holds_the_tensors_of_a_dict_load(tmp_path):
    from tensordict import TensorDict

    store = _store(tmp_path)
    handle = store.handle(1)
    batch = handle.load()
    td = to_tensordict(handle.load())
    assert isinstance(td, TensorDict)
    assert td.batch_size == (T, E) and td.device is None
    assert set(td.keys()) == set(batch) >= {"observation", "next_observation", "tag"}
    for key, tensor in batch.items():
        assert td[key].dtype == tensor.dtype and torch.equal(td[key], tensor), key
    # keys= and device= as for a dict load
    some = to_tensordict(handle.load(keys=["reward", "step"], device="cpu"), device="cpu")
    assert set(some.keys()) == {"reward", "step"} and some.device == torch.device("cpu")
    # The flag that did this in the store is gone, and says what replaced it.
    with pytest.raises(UsageError, match=re.escape("to_tensordict(handle.load(...))")):
        handle.load(as_tensordict=True)
    with pytest.raises(TypeError, match="unexpected keyword"):
        handle.load(as_tensor=True)


def test_torchrl_layout_of_real_transitions(tmp_path):
    store = _store(tmp_path)
    batch = store.handle(1).load()
    td = to_torchrl(batch)
    assert td.batch_size == (T, E)
    assert set(td.keys(True, True)) == {
        "observation", "action", "done", "terminated", "truncated", "step_count", "tag",
        ("collector", "traj_ids"), ("next", "observation"), ("next", "reward"),
        ("next", "done"), ("next", "terminated"), ("next", "truncated"), ("next", "step_count")}
    # the same transitions: next observations follow observations (CountingEnv: [e, t + 1])
    assert torch.equal(td["next", "observation"], td["observation"] + torch.tensor([0.0, 1.0]))
    assert torch.equal(td["next", "observation"], batch["next_observation"])
    # TorchRL's trailing singleton dimension on rewards and flags, and done = terminated|truncated
    for key in ("reward", "done", "terminated", "truncated", "step_count"):
        assert td["next", key].shape == (T, E, 1), key
    assert torch.equal(td["next", "reward"][..., 0], batch["reward"])
    assert torch.equal(td["next", "terminated"][..., 0], batch["terminated"])
    assert torch.equal(td["next", "done"][..., 0], batch["terminated"] | batch["truncated"])
    ends = td["next", "observation"][..., 1] == LENGTH
    assert ends.any() and torch.equal(td["next", "done"][..., 0], ends)
    # the root flags are those of the state a step starts from (after any reset): never done
    assert not td["done"].any() and not td["terminated"].any() and not td["truncated"].any()
    assert torch.equal(td["step_count"][..., 0], batch["step"])
    assert torch.equal(td["next", "step_count"], td["step_count"] + 1)
    assert torch.equal(td["collector", "traj_ids"], batch["episode_id"])
    assert torch.equal(td["action"], batch["action"]) and torch.equal(td["tag"], batch["tag"])
    # env-first: [E, T], contiguous, the same data transposed
    ef = to_torchrl(to_tensordict(store.handle(1).load()), env_first=True)
    assert ef.batch_size == (E, T)
    for key in td.keys(True, True):
        assert ef[key].is_contiguous() and torch.equal(ef[key], td[key].transpose(0, 1)), key
    flat = ef.reshape(-1)  # each env's steps in order
    assert torch.equal(flat["step_count"][:T, 0], batch["step"][:, 0])


def test_truncated_episodes_are_done_and_not_terminated(tmp_path):
    batch = _store(tmp_path, 1, max_steps=LENGTH - 1).handle(0).load()
    td = to_torchrl(batch)
    assert td["next", "truncated"].any() and not td["next", "terminated"].any()
    assert torch.equal(td["next", "done"], td["next", "truncated"])
    assert torch.equal(td["next", "done"][..., 0], td["next", "step_count"][..., 0] == LENGTH - 1)


def test_one_hot_actions(tmp_path):
    batch = _store(tmp_path, 1).handle(0).load()
    td = to_torchrl(batch, one_hot_actions=2)
    assert td["action"].shape == (T, E, 2) and td["action"].dtype == torch.int64
    assert torch.equal(td["action"].argmax(-1), batch["action"])
    assert torch.equal(td["action"].sum(-1), torch.ones(T, E, dtype=torch.int64))
    with pytest.raises(UsageError, match=re.escape(
            "one_hot_actions=1: the batch has actions from 0 to 1, "
            "outside range(1).")):
        to_torchrl(batch, one_hot_actions=1)
    with pytest.raises(UsageError, match="an int >= 1"):
        to_torchrl(batch, one_hot_actions=True)
    floats = dict(batch, action=batch["action"].float())
    with pytest.raises(UsageError, match=re.escape(
            "one_hot_actions=2 needs the integer actions of a Discrete space ([T, E]); the "
            f"batch's action is torch.float32 of shape {(T, E)}.")):
        to_torchrl(floats, one_hot_actions=2)


def test_bad_batches_are_refused_with_what_to_do(tmp_path):
    store = _store(tmp_path, 1)
    handle = store.handle(0)
    some = handle.load(keys=["observation", "reward"])
    with pytest.raises(UsageError, match=re.escape(
            "to_torchrl needs the arrays ['next_observation', 'action', 'terminated', "
            "'truncated'], which this batch was loaded without (it has ['observation', "
            "'reward']); load it without keys=")):
        to_torchrl(some)
    with pytest.raises(UsageError, match=re.escape("(it is in TorchRL's layout already)")):
        to_torchrl(to_torchrl(handle.load()))
    batch = handle.load()
    with pytest.raises(UsageError, match=re.escape(
            f"'reward' has shape {(T - 1, E)} and 'action' {(T, E)}.")):
        to_torchrl(dict(batch, reward=batch["reward"][1:]))
    with pytest.raises(UsageError, match=re.escape(
            "the batch has policy outputs named ['done'], which TorchRL's layout uses")):
        to_torchrl(dict(batch, done=batch["terminated"]))
    with pytest.raises(UsageError, match=re.escape("'truncated' as bool, got torch.float32")):
        to_torchrl(dict(batch, truncated=batch["truncated"].float()))
    with pytest.raises(UsageError, match="got a batch with no arrays"):
        to_tensordict({})
    with pytest.raises(UsageError, match="got ndarray"):
        to_tensordict(np.zeros((T, E)))  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=re.escape("needs a TorchRL replay buffer (with "
                                                   ".extend), got dict")):
        extend_replay_buffer({}, store)
    with pytest.raises(UsageError, match="got a int among its handles"):
        extend_replay_buffer(_Extendable(), [handle, 3])  # type: ignore[list-item]


class _Extendable:
    def extend(self, data):
        pass


def test_a_missing_tensordict_names_the_extra_before_anything_is_read(tmp_path, monkeypatch):
    store = _store(tmp_path, 1)
    handle = store.handle(0)
    batch = handle.load()
    store.delete_batches([0])  # a read would now raise BatchNotFoundError
    monkeypatch.setitem(sys.modules, "tensordict", None)  # as if it were not installed
    for call in (lambda: to_tensordict(batch),
                 lambda: to_torchrl(batch), lambda: extend_replay_buffer(_Extendable(), store)):
        with pytest.raises(MissingDependencyError, match=re.escape(INSTALL)) as info:
            call()
        assert isinstance(info.value, ImportError)
