"""Ready-made policies: what the CLI collects with when no policy is given, and a baseline."""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from daskrl.errors import ConfigError
from daskrl.worker._spaces import SpaceLayout, check_space

__all__ = ["MLPPolicy"]


class MLPPolicy(nn.Module):
    """A stochastic MLP policy for ``Box`` observations and ``Discrete``/``Box`` actions.

    Returns ``{"action", "log_prob"}``: a categorical sample for ``Discrete`` actions, a
    Gaussian sample around ``tanh``-scaled means for ``Box`` actions (the env clips to bounds).
    A ``Dict`` or ``Tuple`` observation space is flattened: each entry (a ``Discrete`` one as
    its index) as floats, concatenated in the space's order, found by key (so a loaded batch's
    ``batch["observation"]``, whatever its key order, gives the same input).  For anything
    better (an encoder per entry, embeddings of discrete entries), write a policy.
    """

    center: torch.Tensor
    scale: torch.Tensor
    """Buffers of a ``Box`` action space: the middle of its bounds and their half-width."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space,
                 hidden: tuple[int, ...] = (64, 64)) -> None:
        super().__init__()
        self.obs_paths: list[tuple[str | int, ...]] | None = None
        if isinstance(observation_space, (spaces.Dict, spaces.Tuple)):
            try:
                check_space("(MLPPolicy)", "observation", observation_space)
            except ConfigError as e:
                raise ConfigError(f"MLPPolicy cannot flatten this space: {e}") from None
            leaves = SpaceLayout(observation_space).leaves
            self.obs_paths = [tuple(int(p) if p.isdigit() else p for p in leaf.path.split("/"))
                              for leaf in leaves]
            n_in = sum(int(np.prod(leaf.shape)) for leaf in leaves)
        elif isinstance(observation_space, spaces.Box):
            n_in = int(np.prod(observation_space.shape))
        else:
            raise ConfigError(f"MLPPolicy needs a Box observation space, or a Dict or Tuple "
                              f"space of Box (and Discrete) entries, got {observation_space!r}.")
        if isinstance(action_space, spaces.Discrete):
            n_out = int(action_space.n)
            self.discrete = True
        elif isinstance(action_space, spaces.Box):
            n_out = int(np.prod(action_space.shape))
            self.discrete = False
            low = torch.as_tensor(action_space.low, dtype=torch.float32).reshape(-1)
            high = torch.as_tensor(action_space.high, dtype=torch.float32).reshape(-1)
        else:
            raise ConfigError(f"MLPPolicy needs a Discrete or Box action space, got {action_space!r}.")
        layers: list[nn.Module] = []
        for h in hidden:
            layers += [nn.Linear(n_in, h), nn.Tanh()]
            n_in = h
        layers.append(nn.Linear(n_in, n_out))
        self.net = nn.Sequential(*layers)
        self.action_shape = tuple(action_space.shape or ())
        if not self.discrete:
            self.register_buffer("center", (high + low) / 2)
            self.register_buffer("scale", (high - low) / 2)
            self.log_std = nn.Parameter(torch.full((n_out,), math.log(0.5)))
        self.start = int(getattr(action_space, "start", 0))

    def forward(self, obs: Any) -> dict[str, torch.Tensor]:
        if self.obs_paths is not None:
            parts = []
            for path in self.obs_paths:
                leaf = obs
                for p in path:
                    leaf = leaf[p]
                parts.append(leaf.reshape(leaf.shape[0], -1).float())
            flat = torch.cat(parts, 1)
        else:
            flat = obs.flatten(1).float()
        x = self.net(flat)
        if self.discrete:
            categorical = torch.distributions.Categorical(logits=x)
            action = categorical.sample()
            return {"action": action + self.start, "log_prob": categorical.log_prob(action)}
        mean = torch.tanh(x) * self.scale + self.center
        normal = torch.distributions.Normal(mean, self.log_std.exp() * self.scale)
        action = normal.sample()
        log_prob = normal.log_prob(action).sum(-1)
        return {"action": action.reshape(-1, *self.action_shape), "log_prob": log_prob}
