"""Checks the learner makes before any worker spends time: the env, the policy's output, the
store (:func:`check_on_learner`), and later what workers wrote to the store's probe."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from daskrl.collect._env_list import resolve_envs
from daskrl.config import CollectorConfig
from daskrl.errors import PolicyError, StoreError
from daskrl.store._store import TrajectoryStore, check_store_options, normalize_url
from daskrl.weights._snapshot import PolicyLike, PolicySpec, policy_spec, resolve_policy
from daskrl.worker._envs import EnvLike, EnvSpec
from daskrl.worker._policy_output import (
    check_action,
    check_extras,
    describe,
    split_policy_output,
)
from daskrl.worker._recurrent import check_recurrent, is_recurrent
from daskrl.worker._spaces import SpaceLayout

__all__ = ["Checked", "check_on_learner", "check_policy_output", "check_probe"]


@dataclasses.dataclass
class Checked:
    """What :func:`check_on_learner` found good: the env, its spaces, the policy, the store."""

    env_spec: EnvSpec
    """The env (the first of :attr:`env_specs`)."""
    observation_space: Any
    action_space: Any
    module: torch.nn.Module
    policy_spec: PolicySpec
    store: TrajectoryStore
    env_specs: tuple[EnvSpec, ...] = ()
    """Every env of the collection, by env index (one, unless ``env`` was a list)."""
    config: CollectorConfig | None = None
    """The config, with ``envs_per_worker`` a vector env's ``num_envs``."""


def check_on_learner(env: EnvLike | Sequence[EnvLike], policy: PolicyLike, store: str,
                     storage_options: Mapping[str, Any] | None,
                     values: Mapping[str, Any], envs_per_worker_given: bool = True) -> Checked:
    """Everything a collector can check on the learner, before any worker spends time: the
    store URL and options, the config (``values``, its fields) and the envs (each made once
    for its spaces: :func:`~daskrl.collect._env_list.resolve_envs`, where a vector env's
    ``num_envs`` becomes ``envs_per_worker`` unless ``envs_per_worker_given``), the policy's
    output on sample observations, and the store (created if new; a store with no run number
    left fails). Several envs (a list) must share their spaces."""
    check_store_options(normalize_url(store), storage_options)
    resolved = resolve_envs(env, values, envs_per_worker_given)
    cfg, specs = resolved.config, resolved.specs
    obs_space, act_space = resolved.observation_space, resolved.action_space
    env_spec = specs[0]
    module, factory = resolve_policy(policy)
    check_policy_output(module, env_spec, obs_space, act_space, cfg.envs_per_worker)
    spec = policy_spec(module, factory)
    trajectories = TrajectoryStore(store, storage_options, read_only=False)
    trajectories.initialize()
    trajectories.next_run()
    return Checked(env_spec, obs_space, act_space, module, spec, trajectories, specs, cfg)


def _policy_device(module: torch.nn.Module) -> torch.device:
    for t in itertools.chain(module.parameters(), module.buffers()):
        return t.device
    return torch.device("cpu")


def check_policy_output(
    module: torch.nn.Module, env: EnvSpec, obs_space: Any, act_space: Any, n_envs: int
) -> None:
    """Run the learner's policy on ``n_envs`` sample observations; check the action fits and
    the extra outputs can be stored (names, envs first), and a recurrent policy's state
    (:func:`~daskrl.worker._recurrent.check_recurrent`), before any worker runs it."""
    layout = SpaceLayout(obs_space)  # a Dict or Tuple space: a dict or tuple of tensors
    samples = [layout.split(obs_space.sample()) for _ in range(n_envs)]
    device = _policy_device(module)
    obs = layout.join([torch.as_tensor(np.stack([s[j] for s in samples]), device=device)
                       for j in range(len(layout.leaves))])
    if is_recurrent(module):
        out = check_recurrent(module, obs, n_envs, device)
    else:
        try:
            with torch.inference_mode():
                out = module(obs)
        except Exception as e:
            raise PolicyError(
                f"the policy raised on a batch of {n_envs} sample observations of env "
                f"{env.name} ({describe(obs)}): {type(e).__name__}: {e}"
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
