"""Environment specs: a gymnasium id or a factory, checked on the learner, built on workers."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from daskrl.errors import ConfigError, EnvError
from daskrl.worker._env_import import import_env_factory
from daskrl.worker._spaces import check_space
from daskrl.worker._wrappers import WrapperSpec, apply_wrappers

__all__ = ["ENDLESS_EPISODE_STEPS", "EnvLike", "EnvSpec"]

EnvLike = str | Callable[[], gym.Env]

ENDLESS_EPISODE_STEPS = 1_000_000
"""Default of :attr:`EnvSpec.endless_episode_steps`."""

_check_space = check_space  # its name here before spaces had a module of their own

@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """What a worker needs to build one environment."""

    env: EnvLike
    """A registered gymnasium id (``"module:Id"`` imports the module first), an import path
    ``"module:factory"`` of a callable making the env, or a zero-argument factory returning a
    ``gymnasium.Env``."""
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

    def __post_init__(self) -> None:
        limit = self.endless_episode_steps
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigError(f"endless_episode_steps must be a positive int, got {limit!r}.")
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

    def make(self) -> gym.Env:
        """Build one environment (raises :class:`EnvError` naming the env)."""
        factory = import_env_factory(self.env) if isinstance(self.env, str) else None
        try:
            if isinstance(self.env, str):
                env = (gym.make(self.env, **dict(self.env_kwargs)) if factory is None
                       else factory(**dict(self.env_kwargs)))
            else:
                env = self.env()
        except AssertionError as e:
            if "daemonic" in str(e):
                raise EnvError(
                    f"env {self.name} starts sub-processes (e.g. gymnasium's AsyncVectorEnv), "
                    "which a Dask worker process cannot do: its processes are daemonic. Return "
                    "a single env (daskrl steps envs_per_worker of them per task), or run "
                    "workers that may have children (dask config distributed.worker.daemon: "
                    "False, or DASK_DISTRIBUTED__WORKER__DAEMON=False)."
                ) from e
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
            msg = str(e).rstrip(".")
            raise EnvError(f"could not make env {self.name}: TypeError: {msg}.{todo}") from e
        except Exception as e:
            raise EnvError(f"could not make env {self.name}: {type(e).__name__}: {e}") from e
        if isinstance(env, gym.vector.VectorEnv):
            env.close()
            raise EnvError(
                f"env {self.name} built a vector env ({type(env).__name__}); return a single "
                "gymnasium.Env: daskrl steps envs_per_worker of them together on each worker."
            )
        if not isinstance(env, gym.Env):
            raise EnvError(
                f"env {self.name} built a {type(env).__name__}, expected a gymnasium.Env."
            )
        env = apply_wrappers(env, self.wrappers, self.name)
        if self.max_episode_steps is not None:
            env = gym.wrappers.TimeLimit(env, max_episode_steps=self.max_episode_steps)
        return env

    def probe(self) -> tuple[gym.Space, gym.Space]:
        """Build one env on the learner to check it early; return its (obs, action) spaces."""
        env = self.make()
        try:
            check_space(self.name, "observation", env.observation_space)
            check_space(self.name, "action", env.action_space)
            return env.observation_space, env.action_space
        finally:
            env.close()


def apply_env_vars(env_vars: Mapping[str, str]) -> None:
    """Set environment variables in this process (on a worker, before envs are built)."""
    for k, v in env_vars.items():
        os.environ[k] = str(v)


def check_env_vars(env_vars: Mapping[str, Any]) -> dict[str, str]:
    """Validate ``env_vars``: string names, values that can be strings."""
    out = {}
    for k, v in env_vars.items():
        if not k or "=" in k:
            raise ConfigError(f"env_vars has an invalid variable name {k!r}.")
        if not isinstance(v, (str, int, float)) or isinstance(v, bool):
            raise ConfigError(f"env_vars[{k!r}] must be a string or number, got {v!r}.")
        out[k] = str(v)
    return out


def space_dtype(space: gym.Space) -> np.dtype:
    """The numpy dtype of one element of ``space``."""
    return np.dtype(space.dtype)
