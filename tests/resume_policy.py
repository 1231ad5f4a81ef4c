"""A policy factory for ``daskrl collect --policy resume_policy:slow_policy``: the default MLP,
each forward pass slowed down, so that a test can kill a collection part-way through."""

from __future__ import annotations

import time
from typing import Any

import torch

from daskrl.policies import MLPPolicy

DELAY_S = 0.01
"""Seconds each forward pass sleeps (a batch of T steps takes at least T times this)."""


class SlowMLP(MLPPolicy):
    """:class:`~daskrl.policies.MLPPolicy` that sleeps :data:`DELAY_S` per forward pass."""

    def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        time.sleep(DELAY_S)
        return super().forward(obs)


def slow_policy(observation_space: Any, action_space: Any) -> SlowMLP:
    return SlowMLP(observation_space, action_space)
