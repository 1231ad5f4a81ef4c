"""Environment specs: a gymnasium id or a factory, checked on the learner, built on workers."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Mapping
from typing import Any, cast

import gymnasium as gym
import numpy as np

from daskrl.errors import ConfigError, EnvError
from daskrl.worker._env_import import import_env_factory
from daskrl.worker._spaces import check_space
from daskrl.worker._wrappers import (
    WrapperSpec,
    apply_vector_wrappers,
    apply_wrappers,
    split_for_vector,
)

__all__ = ["ENDLESS_EPISODE_STEPS", "EnvLike", "EnvSpec"]

EnvLike = str | Callable[[], gym.Env] | Callable[[], gym.vector.VectorEnv]

VECTORIZATION_MODES = ("sync", "async", "vector_entry_point")
"""``vectorization_mode`` values: those of ``gymnasium.make_vec``."""

ENDLESS_EPISODE_STEPS = 1_000_000
"""Default of :attr:`EnvSpec.endless_episode_steps`."""

_check_space = check_space  # its name here before spaces had a module of their own


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """What a worker needs to build one environment."""

    env: EnvLike
    """A registered gymnasium id (``"module:Id"`` imports the module first), an import path
    ``"module:factory"`` of a callable making the env, or a zero-argument factory returning a
    ``gymnasium.Env`` or a ``gymnasium.vector.VectorEnv``."""
    env_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments for ``gymnasium.make`` (id form only; an imported
    ``"module:factory"`` is called with them)."""
    max_episode_steps: int | None = None
    """Truncate episodes at this many steps (``gymnasium.wrappers.TimeLimit``)."""
    endless_episode_steps: int = ENDLESS_EPISODE_STEPS
    """An episode this long without an end is taken for an env that never ends one (an
    :class:`~daskrl.EnvError` at the end of the batch that reaches it)."""
    wrappers: tuple[WrapperSpec, ...] = ()
    """Applied in order to each env made, inside the ``max_episode_steps`` limit (see
    :mod:`daskrl.worker._wrappers`)."""
    vectorization_mode: str | None = None
    """Id form only: build ``num_envs`` envs as one vector env with ``gymnasium.make_vec`` in
    this mode (``"sync"``, ``"async"``, ``"vector_entry_point"``)."""
    vector_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments for the vector env's constructor (``gymnasium.make_vec``)."""
    num_envs: int | None = None
    """A vector env of this many sub-envs (``None``: single envs). Set from ``envs_per_worker``
    for an id with :attr:`vectorization_mode`, and by :meth:`inspect` for a factory that
    builds a vector env."""
    starts_processes: bool = False
    """The env starts processes of its own (an ``AsyncVectorEnv``; set by :meth:`inspect`):
    a worker whose process is daemonic cannot build it."""

    def __post_init__(self) -> None:
        limit = self.endless_episode_steps
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigError(f"endless_episode_steps must be a positive int, got {limit!r}.")
        self._check_vector_fields()
        if isinstance(self.env, str):
            return
        if not callable(self.env):
            raise ConfigError(
                f"env must be a gymnasium id (str) or a zero-argument factory returning a "
                f"gymnasium.Env, got {type(self.env).__name__}: {self.env!r}."
            )
        if self.env_kwargs:
            raise ConfigError(
                "env_kwargs apply to a gymnasium id only; with an env factory, bind the "
                "arguments in the factory (e.g. functools.partial(make_env, **kwargs))."
            )

    @property
    def label(self) -> str:
        """The id, or the factory's qualified name."""
        if isinstance(self.env, str):
            return self.env
        func = getattr(self.env, "func", self.env)  # see through functools.partial
        qual = getattr(func, "__qualname__", None) or type(func).__name__
        return f"{getattr(func, '__module__', '?')}.{qual}"

    @property
    def name(self) -> str:
        """How errors name the env: ``'CartPole-v1'`` or ``factory module.make_env``."""
        return repr(self.env) if isinstance(self.env, str) else f"factory {self.label}"

    def _check_vector_fields(self) -> None:
        mode, n = self.vectorization_mode, self.num_envs
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ConfigError(f"num_envs must be a positive int or None, got {n!r}.")
        if mode is None:
            if self.vector_kwargs:
                raise ConfigError(
                    "vector_kwargs apply to a vector env made by gymnasium.make_vec: give "
                    f"vectorization_mode too (one of {', '.join(VECTORIZATION_MODES)}).")
            return
        if n is None:
            raise ConfigError(f"vectorization_mode={mode!r} needs num_envs (envs_per_worker): "
                              "the number of sub-envs gymnasium.make_vec builds.")
        if mode not in VECTORIZATION_MODES:
            raise ConfigError(f"vectorization_mode must be one of "
                              f"{', '.join(map(repr, VECTORIZATION_MODES))} or None, got "
                              f"{mode!r}.")
        if not isinstance(self.env, str):
            raise ConfigError(
                f"vectorization_mode={mode!r} applies to a gymnasium id (gymnasium.make_vec); "
                "a factory builds its vector env itself: return a gymnasium.vector.VectorEnv "
                "from it and leave vectorization_mode unset.")

    @property
    def is_vector(self) -> bool:
        """Whether workers build one vector env rather than ``envs_per_worker`` single envs."""
        return self.num_envs is not None or self.vectorization_mode is not None

    def _build(self) -> Any:
        """Call the factory, ``gymnasium.make`` or ``gymnasium.make_vec`` (raising
        :class:`EnvError` naming the env); the result is not checked."""
        factory = import_env_factory(self.env) if isinstance(self.env, str) else None
        if factory is not None and self.vectorization_mode is not None:
            raise ConfigError(
                f"env {self.name} names a callable, and vectorization_mode="
                f"{self.vectorization_mode!r} applies to a gymnasium id (gymnasium.make_vec): "
                "return a gymnasium.vector.VectorEnv from the callable and leave "
                "vectorization_mode unset, or give the env's registered id.")
        try:
            if self.vectorization_mode is not None and factory is None:
                return self._make_vec()
            if factory is not None:
                return factory(**dict(self.env_kwargs))
            if isinstance(self.env, str):
                return gym.make(self.env, **dict(self.env_kwargs))
            return self.env()
        except ConfigError:  # a wrapper spec that cannot apply (WrapperError): as it is
            raise
        except AssertionError as e:
            if "daemonic" in str(e):
                raise daemonic_error(self.name) from e
            raise EnvError(f"could not make env {self.name}: AssertionError: {e}") from e
        except gym.error.Error as e:
            raise EnvError(
                f"could not make env {self.name}: {e} Check the id (registered ids: "
                "gymnasium.pprint_registry()) and import the package that registers it "
                "('module:Id'), or name a callable making the env ('module:factory')."
            ) from e
        except TypeError as e:
            todo = (f" Check env_kwargs {sorted(self.env_kwargs)} (--env-kwargs): the env's "
                    "constructor takes other arguments." if self.env_kwargs else "")
            if self.vector_kwargs:
                todo += (f" Check vector_kwargs {sorted(self.vector_kwargs)} (--vector-kwargs): "
                         "the vector env's constructor takes other arguments.")
            msg = str(e).rstrip(".")
            raise EnvError(f"could not make env {self.name}: TypeError: {msg}.{todo}") from e
        except Exception as e:
            raise EnvError(f"could not make env {self.name}: {type(e).__name__}: {e}") from e

    def _make_vec(self) -> gym.vector.VectorEnv:
        kwargs = dict(self.env_kwargs)
        per_sub_env = self.vectorization_mode in ("sync", "async")
        wrappers, vector_wrappers = split_for_vector(
            self.wrappers, self.name, f"gymnasium.make_vec in mode {self.vectorization_mode!r}",
            per_sub_env)
        if self.max_episode_steps is not None:
            if not per_sub_env:
                kwargs["max_episode_steps"] = self.max_episode_steps  # the entry point's own
            else:
                wrappers.append(functools.partial(gym.wrappers.TimeLimit,
                                                  max_episode_steps=self.max_episode_steps))
        assert isinstance(self.env, str) and self.num_envs is not None
        env = gym.make_vec(self.env, num_envs=self.num_envs,
                           vectorization_mode=self.vectorization_mode,
                           vector_kwargs=dict(self.vector_kwargs) or None,
                           wrappers=cast(Any, wrappers) or None, **kwargs)
        return apply_vector_wrappers(env, vector_wrappers, self.name)

    def make_any(self) -> gym.Env | gym.vector.VectorEnv:
        """Build the env: one ``gymnasium.Env`` (with its time limit), or a vector env."""
        env = self._build()
        if isinstance(env, gym.vector.VectorEnv):
            if self.vectorization_mode is not None:
                return env  # made by gymnasium.make_vec, with the wrappers and time limit
            if self.max_episode_steps is not None:
                env.close()
                raise ConfigError(
                    f"env {self.name} built a vector env ({type(env).__name__}), to which "
                    f"daskrl cannot add a time limit (max_frames_per_traj="
                    f"{self.max_episode_steps}): give its sub-envs one (e.g. "
                    "gymnasium.wrappers.TimeLimit, or max_episode_steps= of gymnasium.make_vec) "
                    "and leave max_frames_per_traj unset."
                )
            try:
                _, vector_wrappers = split_for_vector(
                    self.wrappers, self.name, f"a {type(env.unwrapped).__name__} built by the "
                    "factory", per_sub_env=False)
            except BaseException:
                env.close()
                raise
            return apply_vector_wrappers(env, vector_wrappers, self.name)
        if not isinstance(env, gym.Env):
            raise EnvError(
                f"env {self.name} built a {type(env).__name__}, expected a gymnasium.Env or a "
                "gymnasium.vector.VectorEnv."
            )
        env = apply_wrappers(env, self.wrappers, self.name)
        if self.max_episode_steps is not None:
            env = gym.wrappers.TimeLimit(env, max_episode_steps=self.max_episode_steps)
        return env

    def make(self) -> gym.Env:
        """Build one environment (raises :class:`EnvError` naming the env)."""
        env = self.make_any()
        if isinstance(env, gym.vector.VectorEnv):
            env.close()
            raise EnvError(
                f"env {self.name} built a vector env ({type(env).__name__}) where the "
                "learner's probe built a single gymnasium.Env: a factory must build the same "
                "kind of env every time it is called."
            )
        return env

    def make_vector(self) -> gym.vector.VectorEnv:
        """Build the vector env of :attr:`num_envs` sub-envs (raises :class:`EnvError`)."""
        env = self.make_any()
        if not isinstance(env, gym.vector.VectorEnv):
            env.close()
            raise EnvError(
                f"env {self.name} built a single {type(env).__name__} where the learner's probe "
                "built a vector env: a factory must build the same kind of env every time."
            )
        if self.num_envs is not None and env.num_envs != self.num_envs:
            n = env.num_envs
            env.close()
            raise EnvError(f"env {self.name} built a vector env of num_envs={n}, expected "
                           f"num_envs={self.num_envs} (envs_per_worker, as on the learner).")
        return env

    def inspect(self) -> tuple[EnvSpec, gym.Space, gym.Space]:
        """Build the env once on the learner to check it early; return this spec with
        :attr:`num_envs` set where it builds a vector env, and the (observation, action)
        spaces of one env (a vector env's ``single_*`` spaces)."""
        env = self.make_any()
        try:
            spec = self
            if isinstance(env, gym.vector.VectorEnv):
                spec = dataclasses.replace(self, num_envs=int(env.num_envs), starts_processes=(
                    self.starts_processes or isinstance(env.unwrapped, gym.vector.AsyncVectorEnv)))
                obs_space, act_space = env.single_observation_space, env.single_action_space
            else:
                obs_space, act_space = env.observation_space, env.action_space
            _check_space(self.name, "observation", obs_space)
            _check_space(self.name, "action", act_space)
            return spec, obs_space, act_space
        finally:
            env.close()

    def probe(self) -> tuple[gym.Space, gym.Space]:
        """Build one env on the learner to check it early; return its (obs, action) spaces."""
        _, obs_space, act_space = self.inspect()
        return obs_space, act_space


def daemonic_error(name: str) -> EnvError:
    """The error for an env that starts processes on a worker whose process is daemonic."""
    return EnvError(
        f"env {name} starts sub-processes (e.g. gymnasium's AsyncVectorEnv), which this Dask "
        "worker cannot do: its process is daemonic. The embedded cluster's workers may have "
        "children; for other clusters set the dask config distributed.worker.daemon: False "
        "where the workers' nannies run (DASK_DISTRIBUTED__WORKER__DAEMON=False for `dask "
        "worker`), or step the envs in the worker's process (a sync or vector_entry_point "
        "vector env, or single envs). See docs/env-kinds.md."
    )


def check_may_start_processes(spec: EnvSpec, where: str) -> None:
    """Raise :func:`daemonic_error` in a daemonic process (a Dask worker under a default
    nanny) for an env that starts processes of its own."""
    import multiprocessing

    if spec.starts_processes and multiprocessing.current_process().daemon:
        raise EnvError(f"{daemonic_error(spec.name)} [{where}]")


def apply_env_vars(env_vars: Mapping[str, str]) -> None:
    """Set environment variables in this process (on a worker, before envs are built)."""
    for k, v in env_vars.items():
        os.environ[k] = str(v)




def space_dtype(space: gym.Space) -> np.dtype:
    """The numpy dtype of one element of ``space``."""
    return np.dtype(space.dtype)
