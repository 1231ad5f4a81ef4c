"""Env ids of the form ``module:name``: a gymnasium id registered by importing ``module``
(``daskrl.testing:Counting-v0``, as ``gymnasium.make`` takes it), or a callable of ``module``
that makes the env (``my_project.envs:make_env``, ``daskrl.testing:CountingEnv``).

The rule: ``module`` is imported; if ``name`` is then a registered gymnasium id, the env is
``gymnasium.make(name, **env_kwargs)``; otherwise, if ``module`` has a callable attribute
``name`` (dotted for nested ones), the env is ``name(**env_kwargs)`` (with no ``env_kwargs``, a
zero-argument factory).

A plain id without ``:`` imports nothing, except where its namespace is one that a package
registers on import, as gymnasium's own docs say to ``import`` first: ``ALE/Pong-v5`` imports
``ale_py`` (the ``daskrl[atari]`` extra) if the id is not registered yet, on the learner and on
each worker, so the id works as gymnasium's docs write it, with nothing for the user to import.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from daskrl.errors import EnvError

__all__ = ["NAMESPACE_PACKAGES", "import_env_factory"]

NAMESPACE_PACKAGES: dict[str, tuple[str, str]] = {
    "ALE": ("ale_py", 'pip install "daskrl[atari]" (ale-py, opencv for AtariPreprocessing)'),
}
"""Id namespaces whose envs a package registers when imported: namespace -> (module, how to
install it)."""


def import_env_factory(env_id: str) -> Callable[..., Any] | None:
    """The factory ``env_id`` names (``"module:factory"``), or None for a gymnasium id (plain,
    or ``"module:Id"`` registered by ``module``). Raises :class:`EnvError` for a module that
    cannot be imported."""
    module_name, sep, name = env_id.partition(":")
    if not sep:
        _import_namespace_package(env_id)
        return None
    if not module_name or not name or ":" in name:
        raise EnvError(f"env {env_id!r} must be 'module:Id' (a gymnasium id the module "
                       "registers) or 'module:factory' (a callable of the module making the "
                       "env), with one ':'.")
    try:
        module: Any = importlib.import_module(module_name)
    except Exception as e:
        raise EnvError(f"env {env_id!r}: cannot import {module_name!r}: {type(e).__name__}: "
                       f"{e}. Install it where the learner and the workers run, or check the "
                       "spelling.") from e
    if name in gym.registry:
        return None  # "module:Id": the module registered the id
    obj: Any = module
    for part in name.split("."):
        obj = getattr(obj, part, None) if part.isidentifier() else None
        if obj is None:
            return None  # not an attribute: gymnasium.make says the id is unknown
    if not callable(obj):
        raise EnvError(f"env {env_id!r}: {module_name}.{name} is a {type(obj).__name__}, "
                       "neither a registered gymnasium id nor a callable making the env.")
    return obj


def _import_namespace_package(env_id: str) -> None:
    """Import the package that registers ``env_id``'s namespace (``ALE/...``: ``ale_py``),
    if it is one of :data:`NAMESPACE_PACKAGES` and the id is not registered yet."""
    namespace, slash, _ = env_id.partition("/")
    if not slash or namespace not in NAMESPACE_PACKAGES or env_id in gym.registry:
        return
    module_name, install = NAMESPACE_PACKAGES[namespace]
    try:
        importlib.import_module(module_name)
    except ImportError as e:
        raise EnvError(f"env {env_id!r}: its namespace {namespace!r} is registered by "
                       f"{module_name!r}, which cannot be imported ({e}): {install}, where the "
                       "learner and the workers run.") from e
