"""Several envs in one collection: ``env=[...]`` (``--env`` given several times), one env per
stream, checked on the learner before any worker starts.

Stream ``s`` collects env ``s % len(envs)`` (its *env index*, which its batches record as
``BatchHandle.env``). With several envs, ``num_workers`` (the number of streams) must be a
multiple of their number, so every env gets as many streams; left to the default it is the
largest such multiple the cluster's workers allow, at least one stream per env. All envs must
have the same observation and action spaces: the run has one policy and its store one layout.

Vector envs (:mod:`daskrl.worker._vector`) may be entries too: a stream's ``E`` envs are then
the vector env's ``num_envs`` sub-envs, so every entry that builds a vector env must have the
same ``num_envs`` (and single-env entries get that many envs each); entries of different
``num_envs`` are refused on the learner (:func:`resolve_envs`), naming them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from daskrl.config import CollectorConfig
from daskrl.errors import ConfigError, EnvSpacesMismatchError
from daskrl.worker._envs import EnvLike, EnvSpec

__all__ = ["Resolved", "env_labels", "env_specs", "inspect_envs", "probe_envs", "resolve_envs",
           "stream_count"]


def env_specs(env: EnvLike | Sequence[EnvLike], cfg: CollectorConfig,
              num_envs: int | None = None) -> tuple[EnvSpec, ...]:
    """One :class:`EnvSpec` per env of ``env`` (an env, or a list or tuple of them), with the
    config's ``env_kwargs``, ``max_frames_per_traj``, ``wrappers`` and, for gymnasium ids,
    ``vectorization_mode`` and ``vector_kwargs`` (a vector env of ``num_envs`` sub-envs,
    default ``cfg.envs_per_worker``)."""
    entries: list[Any] = list(env) if isinstance(env, (list, tuple)) else [env]
    if not entries:
        raise ConfigError("env is an empty list; give a gymnasium id, a factory, or a list of "
                          "them (one env per stream).")
    n = len(entries)
    if n > 1 and cfg.num_workers is not None and cfg.num_workers % n:
        lo = max(n, cfg.num_workers // n * n)
        raise ConfigError(
            f"num_workers={cfg.num_workers} is not a multiple of the {n} envs: stream s "
            f"collects env s % {n}, so each env gets the same number of streams. Use "
            f"num_workers={lo} or {lo + n} (--workers), or leave it to the default.")
    wrappers = cfg.wrapper_specs
    mode = cfg.vectorization_mode
    specs = []
    for i, e in enumerate(entries):
        vector: dict[str, Any] = {}
        if mode is not None and isinstance(e, str):  # a factory builds its vector env itself
            vector = {"vectorization_mode": mode, "vector_kwargs": cfg.vector_kwargs or {},
                      "num_envs": cfg.envs_per_worker if num_envs is None else num_envs}
        try:
            specs.append(EnvSpec(e, cfg.env_kwargs or {}, cfg.max_frames_per_traj,
                                 wrappers=wrappers, **vector))
        except ConfigError as err:
            if n == 1:
                raise
            raise ConfigError(f"env {i} of the list: {err}") from err
    return tuple(specs)


def _where(specs: Sequence[EnvSpec], i: int) -> str:
    return f"env {i} ({specs[i].name})" if len(specs) > 1 else f"env {specs[i].name}"


def probe_envs(specs: Sequence[EnvSpec]) -> tuple[Any, Any]:
    """Make each env once on the learner; return the (observation, action) spaces they share.

    Raises :class:`EnvSpacesMismatchError` naming the first env whose spaces differ from env
    0's (and both spaces)."""
    _, obs_space, act_space = inspect_envs(specs)
    return obs_space, act_space


def inspect_envs(specs: Sequence[EnvSpec]) -> tuple[tuple[EnvSpec, ...], Any, Any]:
    """Make each env once on the learner (:meth:`EnvSpec.inspect`); return the specs (a vector
    env's with its ``num_envs``) and the (observation, action) spaces they share (a vector
    env's single ones).

    Raises :class:`EnvSpacesMismatchError` naming the first env whose spaces differ from env
    0's (and both spaces), and :class:`ConfigError` naming two vector envs of different
    ``num_envs``."""
    head, obs_space, act_space = specs[0].inspect()
    out = [head]
    for i in range(1, len(specs)):
        spec, obs, act = specs[i].inspect()
        out.append(spec)
        for what, first, other in (("observation", obs_space, obs), ("action", act_space, act)):
            if other != first:
                raise EnvSpacesMismatchError(
                    f"the envs of this collection must have the same spaces, but "
                    f"{_where(specs, 0)} has the {what} space {first!r} and {_where(specs, i)} "
                    f"has {other!r}. Wrap them to agree (e.g. --wrapper, or a factory), or "
                    "collect them in separate runs.")
    sized = [(i, s.num_envs) for i, s in enumerate(out) if s.num_envs is not None]
    differs = next(((j, m) for j, m in sized if m != sized[0][1]), None)
    if differs is not None:
        (i, n), (j, m) = sized[0], differs
        raise ConfigError(
            f"the envs of this collection build vector envs of different sizes: "
            f"{_where(out, i)} has num_envs={n} and {_where(out, j)} has num_envs={m}. A "
            "stream's envs are one vector env's sub-envs, and every stream of a run steps the "
            "same number (envs_per_worker): build them with the same num_envs, or collect them "
            "in separate runs.")
    return tuple(out), obs_space, act_space


@dataclasses.dataclass(frozen=True)
class Resolved:
    """The envs of a collection, checked on the learner, and the config they make."""

    config: CollectorConfig
    """With ``envs_per_worker`` the vector envs' ``num_envs`` where there are any."""
    specs: tuple[EnvSpec, ...]
    observation_space: Any
    action_space: Any


def resolve_envs(env: EnvLike | Sequence[EnvLike], values: Mapping[str, Any],
                 given: bool) -> Resolved:
    """Build the config of ``values`` (CollectorConfig fields) and make each env once.

    A vector env's ``num_envs`` is the run's ``envs_per_worker``. Until the envs are made it is
    not known, so unless ``envs_per_worker`` was ``given`` the other fields are checked against
    one env per stream first, and the config is checked again with the ``envs_per_worker``
    the envs give (the vector envs' ``num_envs``, else ``values``' or the default); a given
    ``envs_per_worker`` that differs from a vector env's ``num_envs`` is a ConfigError."""
    wanted = int(values.get("envs_per_worker", CollectorConfig.envs_per_worker))
    first = CollectorConfig(**{**values, "envs_per_worker": wanted if given else 1})
    specs, obs_space, act_space = inspect_envs(env_specs(env, first, num_envs=wanted))
    n = next((s.num_envs for s in specs if s.num_envs is not None), None)
    if n is None or n == wanted:
        cfg = first if first.envs_per_worker == wanted else dataclasses.replace(
            first, envs_per_worker=wanted)
        return Resolved(cfg, specs, obs_space, act_space)
    name = next(s.name for s in specs if s.num_envs is not None)
    if given:
        raise ConfigError(
            f"env {name} builds a vector env of num_envs={n}, but envs_per_worker={wanted} was "
            "given: a vector env's sub-envs are a stream's envs. Leave envs_per_worker unset "
            f"(it is taken from the env) or give envs_per_worker={n}.")
    try:
        cfg = dataclasses.replace(first, envs_per_worker=n)
    except ConfigError as e:
        raise ConfigError(f"env {name} builds a vector env of num_envs={n}, so "
                          f"envs_per_worker={n}: {e}") from e
    return Resolved(cfg, specs, obs_space, act_space)


def env_labels(specs: Sequence[EnvSpec]) -> list[str]:
    """How the run record names each env, by env index."""
    return [s.label for s in specs]


def stream_count(num_workers: int | None, live_workers: int, num_envs: int = 1) -> int:
    """The number of streams: ``num_workers``, or the largest multiple of ``num_envs`` the
    ``live_workers`` allow (at least ``num_envs``; for one env, the live workers)."""
    if num_workers is not None:
        return num_workers
    return num_envs * max(1, live_workers // num_envs)
