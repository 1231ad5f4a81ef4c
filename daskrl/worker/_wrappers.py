"""Wrapper specs: gymnasium wrappers named by text (``--wrapper``, ``wrappers=``), applied in
order to every env a worker makes (and to the learner's probe of the spaces).

The grammar of one spec::

    SPEC   := PATH [ ":" KWARGS ]
    PATH   := a dotted import path of a callable, e.g. gymnasium.wrappers.TimeLimit
    KWARGS := KEY=VALUE [ "," KEY=VALUE ]...   (VALUE a Python literal: 4, 0.5, 'text',
                                                True, None, (84, 84), [1, 2], {'a': 1})

e.g. ``gymnasium.wrappers.FrameStackObservation:stack_size=4`` or
``gymnasium.wrappers.AtariPreprocessing:frame_skip=1,screen_size=84``. The callable is called as
``wrapper(env, **kwargs)`` and must return a ``gymnasium.Env``. Parsing (:func:`parse_wrapper`)
is pure and lives in :mod:`daskrl._settings`; importing and applying (:func:`apply_wrapper`)
happen here, where envs are made.

With a vector env (:func:`split_for_vector`): a subclass of ``gymnasium.vector.VectorWrapper``
(``gymnasium.wrappers.vector.*``) wraps the vector env; any other wrapper wraps each sub-env,
which daskrl can do only where it builds the vector env with ``gymnasium.make_vec`` in the
``sync`` or ``async`` mode (its ``wrappers=``). Elsewhere (a factory's vector env, a
``vector_entry_point`` env, envpool) a single-env wrapper is refused with a
:class:`~daskrl.WrapperError` saying what to do.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from daskrl._settings import WrapperSpec
from daskrl.errors import WrapperError

__all__ = ["apply_vector_wrapper", "apply_vector_wrappers", "apply_wrapper", "apply_wrappers",
           "resolve_wrapper", "split_for_vector", "wraps_vector_envs"]





def resolve_wrapper(spec: WrapperSpec) -> Callable[..., Any]:
    """Import the callable (raises :class:`WrapperError` saying what cannot be imported)."""
    parts = spec.path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            missing = e.name or ""
            if module_name == missing or module_name.startswith(missing + "."):
                continue  # no such module: the path may name an attribute of a shorter one
            raise WrapperError(
                f"wrapper {spec.text!r}: importing {module_name!r} failed: {e}. Install "
                "the package it needs (on the learner and on every worker).") from e
        except Exception as e:
            raise WrapperError(f"wrapper {spec.text!r}: importing {module_name!r} raised "
                               f"{type(e).__name__}: {e}") from e
        for i, attr in enumerate(parts[cut:], start=cut):
            try:
                obj = getattr(obj, attr)
            except AttributeError:
                have = ".".join(parts[:i])
                raise WrapperError(
                    f"wrapper {spec.text!r}: {have!r} has no attribute {attr!r}. Check the "
                    "spelling (e.g. gymnasium.wrappers.FrameStackObservation).") from None
        if not callable(obj):
            raise WrapperError(f"wrapper {spec.text!r} names a {type(obj).__name__}, not a "
                               "callable wrapper(env, **kwargs).")
        return obj
    raise WrapperError(f"wrapper {spec.text!r}: no module of {spec.path!r} can be imported "
                       f"(tried {'.'.join(parts[:-1])!r} and the packages above it). "
                       "Install it, or check the spelling.")


def apply_wrapper(spec: WrapperSpec, env: gym.Env, env_name: str) -> gym.Env:
    """``wrapper(env, **kwargs)``, checked (raises :class:`WrapperError`)."""
    return _call(spec, env, f"env {env_name}", gym.Env, "a gymnasium.Env (a gymnasium.Wrapper)")


def wraps_vector_envs(spec: WrapperSpec) -> bool:
    """Whether the wrapper is a ``gymnasium.vector.VectorWrapper`` (imports it)."""
    obj = resolve_wrapper(spec)
    return isinstance(obj, type) and issubclass(obj, gym.vector.VectorWrapper)


def apply_vector_wrapper(spec: WrapperSpec, env: gym.vector.VectorEnv,
                         env_name: str) -> gym.vector.VectorEnv:
    """``wrapper(env, **kwargs)`` of a vector wrapper, checked."""
    return _call(spec, env, f"vector env {env_name}", gym.vector.VectorEnv,
                 "a gymnasium.vector.VectorEnv")


def _call(spec: WrapperSpec, env: Any, what: str, kind: type, expected: str) -> Any:
    """``wrapper(env, **kwargs)``: its error, or a result that is not a ``kind``, is a
    :class:`WrapperError` naming the wrapper and ``what`` it wrapped."""
    wrapper = resolve_wrapper(spec)
    try:
        wrapped = wrapper(env, **dict(spec.kwargs))
    except Exception as e:
        raise WrapperError(
            f"wrapper {spec.text!r} failed on {what}: {type(e).__name__}: {e}. Check its "
            "KEY=VALUE arguments and that it suits the env's spaces.") from e
    if not isinstance(wrapped, kind):
        raise WrapperError(f"wrapper {spec.text!r} returned a {type(wrapped).__name__} for "
                           f"{what}, expected {expected}.")
    return wrapped


def _wrap_one(spec: WrapperSpec, env_name: str, env: gym.Env) -> gym.Env:
    return apply_wrapper(spec, env, env_name)


def split_for_vector(wrappers: tuple[WrapperSpec, ...], env_name: str, kind: str,
                     per_sub_env: bool) -> tuple[list[Callable[[gym.Env], gym.Env]],
                                                 tuple[WrapperSpec, ...]]:
    """``wrappers`` for a vector env ``kind``: the sub-env wrappers (callables for
    ``gymnasium.make_vec``'s ``wrappers=``, in order) and the vector wrappers after them.

    ``per_sub_env``: whether daskrl builds the sub-envs (``gymnasium.make_vec`` in the
    ``sync``/``async`` mode). Raises :class:`WrapperError` for a single-env wrapper where it
    does not, and for one after a vector wrapper."""
    single: list[Callable[[gym.Env], gym.Env]] = []
    vector: list[WrapperSpec] = []
    for w in wrappers:
        if wraps_vector_envs(w):
            vector.append(w)
            continue
        name = w.path.rsplit(".", 1)[-1]
        import gymnasium.wrappers.vector as vector_wrappers

        alt = (f"its vector form gymnasium.wrappers.vector.{name}, "
               if hasattr(vector_wrappers, name) else "a gymnasium.vector.VectorWrapper, ")
        if not per_sub_env:
            raise WrapperError(
                f"wrapper {w.text!r} wraps single envs, but env {env_name} builds a vector env "
                f"({kind}), whose sub-envs daskrl does not make. Use {alt}or apply it to each "
                "sub-env inside the factory (e.g. gymnasium.make_vec(..., wrappers=[...])), or "
                "give a gymnasium id with vectorization_mode='sync' or 'async', where wrappers "
                "apply to each sub-env.")
        if vector:
            raise WrapperError(
                f"wrapper {w.text!r} wraps single envs and comes after the vector wrapper "
                f"{vector[-1].text!r} (env {env_name}): daskrl applies the wrappers of the "
                "sub-envs first, then those of the vector env. Give the sub-env wrappers "
                "first.")
        single.append(functools.partial(_wrap_one, w, env_name))
    return single, tuple(vector)


def apply_vector_wrappers(env: gym.vector.VectorEnv, wrappers: tuple[WrapperSpec, ...],
                          env_name: str) -> gym.vector.VectorEnv:
    """Apply vector wrappers in order; close ``env`` if one fails."""
    return _in_order(env, [functools.partial(apply_vector_wrapper, w, env_name=env_name)
                           for w in wrappers])








def apply_wrappers(env: gym.Env, wrappers: tuple[WrapperSpec, ...], env_name: str) -> gym.Env:
    """Apply ``wrappers`` in order (the first is innermost); close ``env`` if one fails."""
    return _in_order(env, [functools.partial(apply_wrapper, w, env_name=env_name) for w in wrappers])


def _in_order(env: Any, steps: list[Any]) -> Any:
    """``env`` wrapped by each step in turn; the env so far is closed if a step fails."""
    for step in steps:
        try:
            env = step(env)
        except BaseException:
            try:
                env.close()
            except Exception:  # closing is best effort; the wrapper's error is what matters
                pass
            raise
    return env
