"""Recurrent policies for testing: a state that counts, and a GRU."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from daskrl.testing._policies import _first_tensor


class StepCountPolicy(nn.Module):
    """A recurrent policy whose state counts the steps since its env's episode started.

    Action 0 always; the extra output ``count`` is the state plus one, so a batch collected
    with it must store ``count == step + 1``, ``policy_state`` equal to its first row's
    ``step`` and ``is_init == (step == 0)``. The extra output ``tag`` is its ``tag``
    parameter, as :class:`~daskrl.testing.TagPolicy`'s (set it to tell weights versions
    apart). The state is a tensor ``int64 [num_envs, 1]``, or
    with ``mapping=True`` the mapping ``{"steps": int64 [num_envs], "half": float32
    [num_envs, 2]}`` (``half`` holds ``steps / 2`` twice).
    """

    def __init__(self, mapping: bool = False) -> None:
        super().__init__()
        self.mapping = mapping
        self.tag = nn.Parameter(torch.zeros(()))

    def initial_state(self, num_envs: int) -> Any:
        device = self.tag.device  # the worker's: the state lives beside the weights
        if self.mapping:
            return {"steps": torch.zeros(num_envs, dtype=torch.int64, device=device),
                    "half": torch.zeros(num_envs, 2, device=device)}
        return torch.zeros(num_envs, 1, dtype=torch.int64, device=device)

    def forward(self, obs: Any, state: Any) -> tuple[dict[str, torch.Tensor], Any]:
        first = _first_tensor(obs)
        steps = state["steps"] if self.mapping else state[:, 0]
        out = {"action": torch.zeros(first.shape[0], dtype=torch.int64, device=first.device),
               "count": steps + 1, "tag": self.tag.detach().expand(first.shape[0]).clone()}
        if self.mapping:
            new = {"steps": steps + 1, "half": ((steps + 1) / 2)[:, None].expand(-1, 2) + 0}
            return out, new
        return out, state + 1


class GRUPolicy(nn.Module):
    """A GRU policy for flat observations and a ``Discrete`` action space: the state is the
    GRU's hidden state ``[num_envs, hidden]`` (zeros at an episode's start), the action is
    sampled from its logits, which it also returns (``logits``) for a learner to check a
    replay against."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 16) -> None:
        super().__init__()
        self.hidden = hidden
        self.cell = nn.GRUCell(obs_dim, hidden)
        self.head = nn.Linear(hidden, n_actions)

    def initial_state(self, num_envs: int) -> torch.Tensor:
        return torch.zeros(num_envs, self.hidden, device=self.head.weight.device)

    def forward(self, obs: torch.Tensor, state: torch.Tensor
                ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        h = self.cell(obs.float().flatten(1), state)
        logits = self.head(h)
        action = torch.distributions.Categorical(logits=logits).sample()
        return {"action": action, "logits": logits}, h
