"""Small deterministic (or seeded random) policies."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch
from gymnasium import spaces
from torch import nn


def _first_tensor(obs: Any) -> torch.Tensor:
    """The first tensor of an observation: itself, or the first leaf of a dict or tuple."""
    while not isinstance(obs, torch.Tensor):
        obs = next(iter(obs.values())) if isinstance(obs, dict) else obs[0]
    return obs


class TagPolicy(nn.Module):
    """Always action 0; reports its ``tag`` parameter as the extra output ``"tag"``.

    Set ``tag`` to the weights version before each ``update_weights`` to check which weights
    computed each stored step.
    """

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.tag = nn.Parameter(torch.zeros((), dtype=dtype))

    def forward(self, obs: Any) -> dict[str, torch.Tensor]:
        first = _first_tensor(obs)  # obs may be a dict or tuple of tensors (a Dict space)
        n = first.shape[0]
        return {
            "action": torch.zeros(n, dtype=torch.int64, device=first.device),
            "tag": self.tag.detach().float().expand(n).clone(),
        }


class ConstantPolicy(nn.Module):
    """Returns a fixed action for every env (for Box or Discrete spaces)."""

    action: torch.Tensor

    def __init__(self, action: Any, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.register_buffer("action", torch.as_tensor(action, dtype=dtype))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.action.expand(obs.shape[0], *self.action.shape).clone()


class EnvVarPolicy(TagPolicy):
    """A :class:`TagPolicy` that reads the environment variable ``name`` at every step: it
    raises ``KeyError`` where that is unset (say, set on the learner but not on workers)."""

    def __init__(self, name: str = "DASKRL_TEST_POLICY_VAR") -> None:
        super().__init__()
        self.name = name

    def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        import os

        os.environ[self.name]  # the lookup is the point
        return super().forward(obs)


class SpacePolicy(nn.Module):
    """Random actions of any supported action space, nested for a ``Dict`` or ``Tuple`` one:
    integers in range for ``Discrete``/``MultiDiscrete``/``MultiBinary`` entries, and for a
    ``Box`` normal samples of scale ``box_scale`` (so that some fall outside bounds of +-1,
    which the env receives clipped).  Works on any observation, nested or not."""

    def __init__(self, action_space: gym.Space, box_scale: float = 2.0) -> None:
        super().__init__()
        self.action_space = action_space
        self.box_scale = box_scale

    def forward(self, obs: Any) -> dict[str, Any]:
        first = _first_tensor(obs)
        return {"action": self._sample(self.action_space, first.shape[0], first.device)}

    def _sample(self, space: gym.Space, n: int, device: torch.device) -> Any:
        if isinstance(space, spaces.Dict):
            return {k: self._sample(s, n, device) for k, s in space.spaces.items()}
        if isinstance(space, spaces.Tuple):
            return tuple(self._sample(s, n, device) for s in space.spaces)
        if isinstance(space, spaces.Discrete):
            return torch.randint(int(space.n), (n,), device=device) + int(space.start)
        if isinstance(space, spaces.MultiDiscrete):
            nvec = torch.as_tensor(space.nvec, device=device)
            return (torch.rand(n, *space.shape, device=device) * nvec).long() + torch.as_tensor(
                space.start, device=device)
        if isinstance(space, spaces.MultiBinary):
            return torch.randint(2, (n, *space.shape), device=device, dtype=torch.int8)
        return torch.randn(n, *space.shape, device=device) * self.box_scale  # type: ignore[misc]


class NoisePolicy(nn.Module):
    """Action 0, plus an extra output ``"noise"`` of ``width`` incompressible floats per env."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.width = width

    def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        n = obs.shape[0]
        return {"action": torch.zeros(n, dtype=torch.int64), "noise": torch.rand(n, self.width)}
