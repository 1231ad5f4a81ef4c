"""Checks the learner makes before any worker spends time: the policy's output, the store."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import torch

from daskrl.errors import PolicyError, StoreError
from daskrl.store._store import TrajectoryStore
from daskrl.worker._envs import EnvSpec
from daskrl.worker._policy_output import check_action, check_extras, split_policy_output

__all__ = ["check_policy_output", "check_probe"]


def _policy_device(module: torch.nn.Module) -> torch.device:
    for t in itertools.chain(module.parameters(), module.buffers()):
        return t.device
    return torch.device("cpu")


def check_policy_output(
    module: torch.nn.Module, env: EnvSpec, obs_space: Any, act_space: Any, n_envs: int
) -> None:
    """Run the learner's policy on ``n_envs`` sample observations; check the action fits and
    the extra outputs can be stored (names, envs first), before any worker runs it."""
    obs = np.stack([obs_space.sample() for _ in range(n_envs)])
    try:
        with torch.inference_mode():
            out = module(torch.as_tensor(obs, device=_policy_device(module)))
    except Exception as e:
        raise PolicyError(
            f"the policy raised on a batch of {n_envs} sample observations of env {env.name} "
            f"(tensor {tuple(obs.shape)} {obs.dtype}): {type(e).__name__}: {e}"
        ) from e
    action, extras = split_policy_output(out)
    check_action(action, act_space, n_envs, env.name)
    check_extras(extras, n_envs)


def check_probe(store: TrajectoryStore, probe: str, address: str, token: str) -> None:
    """Worker ``address`` must have seen the learner's probe and left its own."""
    if store.read_probe(probe, address) != token:
        raise StoreError(
            f"the learner does not see what worker {address} wrote to the store "
            f"{store.url!r}. A local path is not shared between machines: use a "
            "shared filesystem mounted at the same path everywhere, or an object store URL."
        )
