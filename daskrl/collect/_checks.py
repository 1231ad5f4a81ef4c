"""Checks the learner makes before any worker spends time: the env, the policy's output, the
store (:func:`check_on_learner`), and later what workers wrote to the store's probe."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from daskrl.config import CollectorConfig
from daskrl.errors import ConfigError, PolicyError, StoreError
from daskrl.store._store import TrajectoryStore, check_store_options, normalize_url
from daskrl.weights._snapshot import PolicyLike, PolicySpec, policy_spec, resolve_policy
from daskrl.worker._envs import EnvLike, EnvSpec
from daskrl.worker._policy_output import check_action, check_extras, split_policy_output

__all__ = ["Checked", "check_on_learner", "check_policy_output", "check_probe"]


@dataclasses.dataclass
class Checked:
    """What :func:`check_on_learner` found good: the env, its spaces, the policy, the store."""

    env_spec: EnvSpec
    observation_space: Any
    action_space: Any
    module: torch.nn.Module
    policy_spec: PolicySpec
    store: TrajectoryStore
    config: CollectorConfig | None = None
    """The config, with ``envs_per_worker`` a vector env's ``num_envs``."""


def check_on_learner(env: EnvLike, policy: PolicyLike, store: str,
                     storage_options: Mapping[str, Any] | None,
                     cfg: CollectorConfig, envs_per_worker_given: bool = False,
                     single_envs_per_worker: int | None = None) -> Checked:
    """Everything a collector can check on the learner, before any worker spends time: the
    store URL and options, the env (made once for its spaces), the policy's output on sample
    observations, and the store (created if new; a store with no run number left fails).
    An env factory that builds a vector env sets ``envs_per_worker`` to its ``num_envs``
    (a different one given by the caller, ``envs_per_worker_given``, is an error); one that
    builds a single env, to ``single_envs_per_worker`` where that is given (``cfg`` was
    checked with one env per stream until the kind was known)."""
    check_store_options(normalize_url(store), storage_options)
    env_spec, obs_space, act_space = env_spec_for(env, cfg).inspect()
    cfg = vector_config(env_spec, cfg, envs_per_worker_given, single_envs_per_worker)
    module, factory = resolve_policy(policy)
    check_policy_output(module, env_spec, obs_space, act_space, cfg.envs_per_worker)
    spec = policy_spec(module, factory)
    trajectories = TrajectoryStore(store, storage_options, read_only=False)
    trajectories.initialize()
    trajectories.next_run()
    return Checked(env_spec, obs_space, act_space, module, spec, trajectories, cfg)


def env_spec_for(env: EnvLike, cfg: CollectorConfig) -> EnvSpec:
    """The :class:`EnvSpec` of ``env`` under ``cfg`` (a vector env of ``envs_per_worker``
    sub-envs with ``vectorization_mode``)."""
    mode = cfg.vectorization_mode
    return EnvSpec(env, cfg.env_kwargs or {}, cfg.max_frames_per_traj, vectorization_mode=mode,
                   vector_kwargs=cfg.vector_kwargs or {},
                   num_envs=cfg.envs_per_worker if mode is not None else None)


def vector_config(env_spec: EnvSpec, cfg: CollectorConfig, given: bool,
                  single: int | None = None) -> CollectorConfig:
    """``cfg`` with ``envs_per_worker`` the ``num_envs`` of the vector env a factory built
    (``single`` for single envs, where given)."""
    n = env_spec.num_envs
    if n is None:
        return cfg if single is None else dataclasses.replace(cfg, envs_per_worker=single)
    if n == cfg.envs_per_worker:
        return cfg
    if given:
        raise ConfigError(
            f"env {env_spec.name} builds a vector env of num_envs={n}, but "
            f"envs_per_worker={cfg.envs_per_worker} was given: a vector env's sub-envs are a "
            f"stream's envs. Leave envs_per_worker unset (it is taken from the env) or give "
            f"envs_per_worker={n}."
        )
    try:
        return dataclasses.replace(cfg, envs_per_worker=n)
    except ConfigError as e:
        raise ConfigError(f"env {env_spec.name} builds a vector env of num_envs={n}, so "
                          f"envs_per_worker={n}: {e}") from e


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
