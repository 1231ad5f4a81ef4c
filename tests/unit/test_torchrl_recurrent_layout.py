"""``to_torchrl``'s layout of a recurrent policy's batch, on hand-made batches: TorchRL's
keys and shapes for each form of the stored state, and clear errors where it cannot tell."""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("tensordict")

from daskrl import UsageError
from daskrl.integrations.torchrl import to_torchrl


def _batch(T, E, state):
    step = torch.arange(T)[:, None].expand(T, E) % 3
    return {"observation": torch.zeros(T, E, 2), "next_observation": torch.zeros(T, E, 2),
            "action": torch.zeros(T, E, dtype=torch.int64), "reward": torch.zeros(T, E),
            "terminated": step == 2, "truncated": torch.zeros(T, E, dtype=torch.bool),
            "step": step, "is_init": step == 0, "policy_state": state}


def test_a_per_batch_mapping_state_fills_row_zero_under_lstm_keys():
    h, c = torch.rand(3, 5), torch.rand(3, 5)
    td = to_torchrl(_batch(4, 3, {"h": h, "c": c}), env_first=True)
    assert td["recurrent_state_h"].shape == (3, 4, 1, 5)
    assert torch.equal(td["recurrent_state_h"][:, 0, 0], h)
    assert torch.equal(td["recurrent_state_c"][:, 0, 0], c)
    assert not td["recurrent_state_h"][:, 1:].any()
    assert torch.equal(td["is_init"][..., 0], (torch.arange(4) % 3 == 0).expand(3, 4))


def test_a_per_step_state_keeps_its_layers():
    state = torch.rand(4, 3, 2, 5)  # [T, E, num_layers, hidden]
    td = to_torchrl(_batch(4, 3, state))
    assert torch.equal(td["recurrent_state"], state)


def test_the_form_is_asked_for_where_shapes_leave_it_open():
    batch = _batch(3, 3, torch.rand(3, 3))  # [E, hidden=3] or [T, E]
    with pytest.raises(UsageError, match=re.escape(
            "pass state_form='first' or 'every_step'")):
        to_torchrl(batch)
    assert to_torchrl(batch, state_form="first")["recurrent_state"].shape == (3, 3, 1, 3)
    assert to_torchrl(batch, state_form="every_step")["recurrent_state"].shape == (3, 3)
    with pytest.raises(UsageError, match=re.escape("state_form must be one of")):
        to_torchrl(batch, state_form="once")
    with pytest.raises(UsageError, match=re.escape("not [4, 3] + [...]")):
        to_torchrl(_batch(4, 3, torch.rand(3, 5)), state_form="every_step")


def test_a_state_without_is_init_or_with_a_clashing_output_is_refused():
    batch = _batch(4, 3, torch.rand(3, 5))
    with pytest.raises(UsageError, match="policy_state but no is_init"):
        to_torchrl({k: v for k, v in batch.items() if k != "is_init"})
    with pytest.raises(UsageError, match=re.escape("policy outputs named ['recurrent_state']")):
        to_torchrl(dict(batch, recurrent_state=torch.zeros(4, 3)))
    stateless = {k: v for k, v in batch.items() if k != "policy_state"}
    assert to_torchrl(dict(stateless, recurrent_state_x=torch.zeros(4, 3)))["is_init"].shape == (4, 3)
