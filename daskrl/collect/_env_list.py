"""Several envs in one collection: ``env=[...]`` (``--env`` given several times), one env per
stream, checked on the learner before any worker starts.

Stream ``s`` collects env ``s % len(envs)`` (its *env index*, which its batches record as
``BatchHandle.env``). With several envs, ``num_workers`` (the number of streams) must be a
multiple of their number, so every env gets as many streams; left to the default it is the
largest such multiple the cluster's workers allow, at least one stream per env. All envs must
have the same observation and action spaces: the run has one policy and its store one layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from daskrl.config import CollectorConfig
from daskrl.errors import ConfigError, EnvSpacesMismatchError
from daskrl.worker._envs import EnvLike, EnvSpec

__all__ = ["env_labels", "env_specs", "probe_envs", "stream_count"]


def env_specs(env: EnvLike | Sequence[EnvLike], cfg: CollectorConfig) -> tuple[EnvSpec, ...]:
    """One :class:`EnvSpec` per env of ``env`` (an env, or a list or tuple of them), with the
    config's ``env_kwargs``, ``max_frames_per_traj`` and ``wrappers``."""
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
    specs = []
    for i, e in enumerate(entries):
        try:
            specs.append(EnvSpec(e, cfg.env_kwargs or {}, cfg.max_frames_per_traj,
                                 wrappers=wrappers))
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
    obs_space, act_space = specs[0].probe()
    for i in range(1, len(specs)):
        obs, act = specs[i].probe()
        for what, first, other in (("observation", obs_space, obs), ("action", act_space, act)):
            if other != first:
                raise EnvSpacesMismatchError(
                    f"the envs of this collection must have the same spaces, but "
                    f"{_where(specs, 0)} has the {what} space {first!r} and {_where(specs, i)} "
                    f"has {other!r}. Wrap them to agree (e.g. --wrapper, or a factory), or "
                    "collect them in separate runs.")
    return obs_space, act_space


def env_labels(specs: Sequence[EnvSpec]) -> list[str]:
    """How the run record names each env, by env index."""
    return [s.label for s in specs]


def stream_count(num_workers: int | None, live_workers: int, num_envs: int = 1) -> int:
    """The number of streams: ``num_workers``, or the largest multiple of ``num_envs`` the
    ``live_workers`` allow (at least ``num_envs``; for one env, the live workers)."""
    if num_workers is not None:
        return num_workers
    return num_envs * max(1, live_workers // num_envs)
