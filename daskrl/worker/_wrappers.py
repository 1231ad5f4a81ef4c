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
is pure; importing and applying (:meth:`WrapperSpec.apply`) happen where envs are made.

With a vector env (:func:`split_for_vector`): a subclass of ``gymnasium.vector.VectorWrapper``
(``gymnasium.wrappers.vector.*``) wraps the vector env; any other wrapper wraps each sub-env,
which daskrl can do only where it builds the vector env with ``gymnasium.make_vec`` in the
``sync`` or ``async`` mode (its ``wrappers=``). Elsewhere (a factory's vector env, a
``vector_entry_point`` env, envpool) a single-env wrapper is refused with a
:class:`~daskrl.WrapperError` saying what to do.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym

from daskrl.errors import WrapperError

__all__ = ["WrapperSpec", "apply_vector_wrappers", "apply_wrappers", "parse_wrapper",
           "parse_wrappers", "split_for_vector"]

_GRAMMAR = ("a wrapper spec is 'package.module.Wrapper' or 'package.module.Wrapper:KEY=VALUE,"
            "KEY=VALUE' with Python literals as values, e.g. "
            "'gymnasium.wrappers.FrameStackObservation:stack_size=4'")


@dataclasses.dataclass(frozen=True)
class WrapperSpec:
    """One wrapper: the import path of a callable and its keyword arguments."""

    path: str
    """Dotted import path, e.g. ``"gymnasium.wrappers.TimeLimit"``."""
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments (Python literals) the wrapper is called with after the env."""

    @property
    def text(self) -> str:
        """The canonical spec (what run records store): ``path[:key=repr(value),...]``."""
        if not self.kwargs:
            return self.path
        return self.path + ":" + ",".join(f"{k}={v!r}" for k, v in self.kwargs.items())

    def resolve(self) -> Callable[..., Any]:
        """Import the callable (raises :class:`WrapperError` saying what cannot be imported)."""
        parts = self.path.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            module_name = ".".join(parts[:cut])
            try:
                obj: Any = importlib.import_module(module_name)
            except ModuleNotFoundError as e:
                missing = e.name or ""
                if module_name == missing or module_name.startswith(missing + "."):
                    continue  # no such module: the path may name an attribute of a shorter one
                raise WrapperError(
                    f"wrapper {self.text!r}: importing {module_name!r} failed: {e}. Install "
                    "the package it needs (on the learner and on every worker).") from e
            except Exception as e:
                raise WrapperError(f"wrapper {self.text!r}: importing {module_name!r} raised "
                                   f"{type(e).__name__}: {e}") from e
            for i, attr in enumerate(parts[cut:], start=cut):
                try:
                    obj = getattr(obj, attr)
                except AttributeError:
                    have = ".".join(parts[:i])
                    raise WrapperError(
                        f"wrapper {self.text!r}: {have!r} has no attribute {attr!r}. Check the "
                        "spelling (e.g. gymnasium.wrappers.FrameStackObservation).") from None
            if not callable(obj):
                raise WrapperError(f"wrapper {self.text!r} names a {type(obj).__name__}, not a "
                                   "callable wrapper(env, **kwargs).")
            return obj
        raise WrapperError(f"wrapper {self.text!r}: no module of {self.path!r} can be imported "
                           f"(tried {'.'.join(parts[:-1])!r} and the packages above it). "
                           "Install it, or check the spelling.")

    def apply(self, env: gym.Env, env_name: str) -> gym.Env:
        """``wrapper(env, **kwargs)``, checked (raises :class:`WrapperError`)."""
        wrapper = self.resolve()
        try:
            wrapped = wrapper(env, **dict(self.kwargs))
        except Exception as e:
            raise WrapperError(
                f"wrapper {self.text!r} failed on env {env_name}: {type(e).__name__}: {e}. "
                "Check its KEY=VALUE arguments and that it suits the env's spaces.") from e
        if not isinstance(wrapped, gym.Env):
            raise WrapperError(f"wrapper {self.text!r} returned a {type(wrapped).__name__} for "
                               f"env {env_name}, expected a gymnasium.Env (a gymnasium.Wrapper).")
        return wrapped

    @property
    def wraps_vector_envs(self) -> bool:
        """Whether the wrapper is a ``gymnasium.vector.VectorWrapper`` (imports it)."""
        obj = self.resolve()
        return isinstance(obj, type) and issubclass(obj, gym.vector.VectorWrapper)

    def apply_vector(self, env: gym.vector.VectorEnv, env_name: str) -> gym.vector.VectorEnv:
        """``wrapper(env, **kwargs)`` of a vector wrapper, checked."""
        wrapper = self.resolve()
        try:
            wrapped = wrapper(env, **dict(self.kwargs))
        except Exception as e:
            raise WrapperError(
                f"wrapper {self.text!r} failed on vector env {env_name}: {type(e).__name__}: "
                f"{e}. Check its KEY=VALUE arguments and that it suits the env's spaces.") from e
        if not isinstance(wrapped, gym.vector.VectorEnv):
            raise WrapperError(f"wrapper {self.text!r} returned a {type(wrapped).__name__} for "
                               f"vector env {env_name}, expected a gymnasium.vector.VectorEnv.")
        return wrapped


def _wrap_one(spec: WrapperSpec, env_name: str, env: gym.Env) -> gym.Env:
    return spec.apply(env, env_name)


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
        if w.wraps_vector_envs:
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
    return _in_order(env, [functools.partial(w.apply_vector, env_name=env_name)
                           for w in wrappers])


def _literal_kwargs(text: str, spec: str) -> dict[str, Any]:
    if not text.strip():
        raise WrapperError(f"wrapper spec {spec!r} has nothing after ':'; {_GRAMMAR}.")
    try:
        call = ast.parse(f"f({text})", mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        call = None
    if (not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name) or call.args
            or any(kw.arg is None for kw in call.keywords)):
        raise WrapperError(f"wrapper spec {spec!r}: {text!r} is not KEY=VALUE pairs separated "
                           f"by commas; {_GRAMMAR}.")
    out: dict[str, Any] = {}
    for kw in call.keywords:
        assert kw.arg is not None
        if kw.arg in out:
            raise WrapperError(f"wrapper spec {spec!r} gives {kw.arg!r} twice.")
        try:
            out[kw.arg] = ast.literal_eval(kw.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise WrapperError(
                f"wrapper spec {spec!r}: the value of {kw.arg!r} ({ast.unparse(kw.value)!r}) is "
                f"not a Python literal; quote text ({kw.arg}='...'). For arguments that are "
                "not literals (functions, spaces), wrap the env in a factory instead.") from None
    return out


def parse_wrapper(spec: str | WrapperSpec) -> WrapperSpec:
    """Parse one spec (see the module docstring); raises :class:`WrapperError`."""
    if isinstance(spec, WrapperSpec):
        return spec
    if not isinstance(spec, str):
        raise WrapperError(f"a wrapper must be given as a spec string, got "
                           f"{type(spec).__name__}: {spec!r}; {_GRAMMAR}. Apply wrappers that "
                           "are Python objects in an env factory.")
    path, sep, rest = spec.strip().partition(":")
    path = path.strip()
    parts = path.split(".")
    if len(parts) < 2 or not all(p.isidentifier() for p in parts):
        raise WrapperError(f"wrapper spec {spec!r}: {path!r} is not a dotted import path of a "
                           f"wrapper; {_GRAMMAR}.")
    return WrapperSpec(path, _literal_kwargs(rest, spec) if sep else {})


def parse_wrappers(specs: Any) -> tuple[WrapperSpec, ...]:
    """Parse a sequence of specs (one string is one spec)."""
    if specs is None:
        return ()
    if isinstance(specs, (str, WrapperSpec)):
        specs = [specs]
    if not isinstance(specs, (list, tuple)):
        raise WrapperError(f"wrappers must be a list of wrapper specs, got "
                           f"{type(specs).__name__}: {specs!r}; {_GRAMMAR}.")
    return tuple(parse_wrapper(s) for s in specs)


def apply_wrappers(env: gym.Env, wrappers: tuple[WrapperSpec, ...], env_name: str) -> gym.Env:
    """Apply ``wrappers`` in order (the first is innermost); close ``env`` if one fails."""
    return _in_order(env, [functools.partial(w.apply, env_name=env_name) for w in wrappers])


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
