"""Observation and action spaces as leaves: flat spaces and ``Dict``/``Tuple`` spaces of them.

A flat space (``Box``, ``Discrete``, ``MultiDiscrete``, ``MultiBinary``) is one leaf stored
under its key (``observation``); a ``Dict`` or ``Tuple`` space (nested, too) is one leaf per
entry, stored as ``observation/<key>`` and ``observation/<index>``
(:mod:`daskrl._nested`).  :class:`SpaceLayout` splits an env's (or a policy's) structured
value into its leaves and joins leaves back into the structure gymnasium uses: a dict for a
``Dict`` space, a tuple for a ``Tuple`` space.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from daskrl._nested import MAX_DEPTH, join
from daskrl.errors import ConfigError

__all__ = ["LEAF_SPACES", "Leaf", "SpaceLayout", "check_space"]

LEAF_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
"""Spaces stored as one fixed-shape numeric array each."""


def check_space(name: str, what: str, space: gym.Space) -> None:
    """Raise :class:`~daskrl.ConfigError` unless ``space`` is a leaf space, or a ``Dict`` /
    ``Tuple`` (nested up to :data:`~daskrl._nested.MAX_DEPTH` - 1 levels) of leaf spaces whose
    keys are identifiers."""
    problem = _space_problem(space, "", 1)
    if problem is not None:
        raise ConfigError(
            f"env {name}: its {what} space {problem}; daskrl stores fixed-shape numeric "
            "arrays, so it supports Box, Discrete, MultiDiscrete and MultiBinary spaces and "
            "Dict and Tuple spaces of them (keys that are Python identifiers, at most "
            f"{MAX_DEPTH - 1} levels). Wrap the env (e.g. gymnasium.wrappers.FlattenObservation, "
            "or a gymnasium.ObservationWrapper that renames keys) to give it such a space."
        )


def _space_problem(space: gym.Space, path: str, depth: int) -> str | None:
    if isinstance(space, LEAF_SPACES):
        return None
    at = f"has at {path!r} the space {space!r}, which" if path else f"is {space!r}, which"
    if not isinstance(space, (spaces.Dict, spaces.Tuple)):
        return f"{at} is not supported"
    if depth >= MAX_DEPTH:
        return f"{at} nests too deep"
    items = (list(space.spaces.items()) if isinstance(space, spaces.Dict)
             else [(str(i), s) for i, s in enumerate(space.spaces)])
    if not items:
        return f"{at} is empty"
    for key, sub in items:
        if isinstance(space, spaces.Dict) and not (isinstance(key, str) and key.isidentifier()):
            where = f"at {path!r}" if path else "at its top"
            return (f"has the key {key!r} {where}, which is not a Python identifier (keys "
                    "name stored arrays)")
        problem = _space_problem(sub, join(path, key), depth + 1)
        if problem is not None:
            return problem
    return None


@dataclasses.dataclass(frozen=True)
class Leaf:
    """One leaf space of a (possibly structured) space."""

    path: str
    """Its path below the space (``""`` for a flat space, ``"desired_goal"``, ``"0"``, ``"a/b"``)."""
    space: gym.Space
    shape: tuple[int, ...]
    dtype: np.dtype

    def name(self, key: str) -> str:
        """The array it is stored as: ``key`` or ``key/<path>``."""
        return join(key, self.path)

    def label(self, what: str) -> str:
        """How messages name it: ``observation`` or ``observation['desired_goal']``."""
        if not self.path:
            return what
        return what + "".join(f"[{int(p)}]" if p.isdigit() else f"[{p!r}]"
                              for p in self.path.split("/"))


class SpaceLayout:
    """The leaves of a space, in order, and how its values split into them and join back."""

    def __init__(self, space: gym.Space) -> None:
        self.space = space
        self.structured = isinstance(space, (spaces.Dict, spaces.Tuple))
        self.leaves: list[Leaf] = []
        self._collect(space, "")

    def _collect(self, space: gym.Space, path: str) -> None:
        if isinstance(space, spaces.Dict):
            for k, sub in space.spaces.items():
                self._collect(sub, join(path, k))
        elif isinstance(space, spaces.Tuple):
            for i, sub in enumerate(space.spaces):
                self._collect(sub, join(path, str(i)))
        else:
            self.leaves.append(Leaf(path, space, tuple(space.shape or ()),
                                    np.dtype(space.dtype)))

    def names(self, key: str) -> list[str]:
        """The arrays the leaves are stored as, under ``key``."""
        return [leaf.name(key) for leaf in self.leaves]

    def split(self, value: Any) -> list[Any]:
        """The leaves of a value of the space, in order (not converted or checked).

        Raises :class:`ValueError` naming the path where ``value`` lacks the structure."""
        if not self.structured:
            return [value]
        out: list[Any] = []
        _split(self.space, value, "", out)
        return out

    def join(self, leaves: Sequence[Any]) -> Any:
        """The value of the space whose leaves are ``leaves`` (a dict for ``Dict``, a tuple
        for ``Tuple``)."""
        if not self.structured:
            return leaves[0]
        it = iter(leaves)
        return _join(self.space, it)

    def sample(self, leaves: list[np.ndarray], envs: list[int], spaces_: Sequence[gym.Space]
               ) -> list[np.ndarray]:
        """Copies of the leaves' ``[E, ...]`` arrays with rows ``envs`` sampled from each env's
        own space in ``spaces_`` (seeded per env), in the arrays' dtypes."""
        leaves = [a.copy() for a in leaves]
        for i in envs:
            for a, v in zip(leaves, self.split(spaces_[i].sample())):
                a[i] = np.asarray(v).astype(a.dtype, copy=False).reshape(a.shape[1:])
        return leaves


def _split(space: gym.Space, value: Any, path: str, out: list[Any]) -> None:
    if isinstance(space, spaces.Dict):
        if not isinstance(value, Mapping) or len(value) != len(space.spaces):
            raise ValueError(_shape_problem(space, value, path))
        for k, sub in space.spaces.items():
            if k not in value:
                raise ValueError(_shape_problem(space, value, path))
            _split(sub, value[k], join(path, k), out)
    elif isinstance(space, spaces.Tuple):
        if not isinstance(value, (tuple, list)) or len(value) != len(space.spaces):
            raise ValueError(_shape_problem(space, value, path))
        for i, sub in enumerate(space.spaces):
            _split(sub, value[i], join(path, str(i)), out)
    else:
        out.append(value)


def _shape_problem(space: gym.Space, value: Any, path: str) -> str:
    at = f" at {path!r}" if path else ""
    if isinstance(space, spaces.Dict):
        got = (f"a mapping with keys {sorted(map(str, value))}" if isinstance(value, Mapping)
               else f"a {type(value).__name__}")
        return f"{got}{at} where its space wants a dict with keys {list(space.spaces)}"
    got = (f"a {type(value).__name__} of {len(value)}" if isinstance(value, (tuple, list))
           else f"a {type(value).__name__}")
    assert isinstance(space, spaces.Tuple)
    return f"{got}{at} where its space wants a tuple of {len(space.spaces)}"


def _join(space: gym.Space, it: Any) -> Any:
    if isinstance(space, spaces.Dict):
        return {k: _join(sub, it) for k, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_join(sub, it) for sub in space.spaces)
    return next(it)
