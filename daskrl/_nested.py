"""Nested arrays: how structured observations, actions and info entries map onto array names.

A batch stores one array per leaf of a structure, named by its path: ``observation`` for a
flat observation, ``observation/desired_goal`` for an entry of a ``Dict`` space,
``observation/0`` for an entry of a ``Tuple`` space, ``info/lives`` for an info entry (store
format 2.2).  A path's first component is a Python identifier; each further one an
identifier (a ``Dict`` key, an info key) or a decimal index (a ``Tuple`` position).  Readers
turn the flat ``{path: tensor}`` of a container back into nested mappings with :func:`nest`:
a level whose names are the indices ``0 .. n-1`` becomes a tuple, any other a dict.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

__all__ = ["MAX_DEPTH", "SEP", "flatten", "is_index", "iter_leaves", "join", "nest", "select",
           "tree_map", "valid_name"]

SEP = "/"
"""Separates the components of an array's path."""
MAX_DEPTH = 8
"""Most components an array name may have."""


def is_index(part: str) -> bool:
    """True for a decimal index as a ``Tuple`` position is named: ``0``, ``1``, ``12``."""
    return part.isascii() and part.isdigit() and (part == "0" or part[0] != "0")


def valid_name(name: str) -> bool:
    """True for an array name of format 2.x: an identifier, then (2.2) up to
    :data:`MAX_DEPTH` - 1 further components, each an identifier or a decimal index."""
    parts = name.split(SEP)
    return (len(parts) <= MAX_DEPTH and parts[0].isidentifier()
            and all(p.isidentifier() or is_index(p) for p in parts[1:]))


def join(*parts: str) -> str:
    """The array name of a path (empty parts dropped: ``join("observation", "")`` is
    ``"observation"``)."""
    return SEP.join(p for p in parts if p)


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``{"observation/a": x, "observation/b": y, "reward": r}`` as ``{"observation": {"a": x,
    "b": y}, "reward": r}``; a level named ``0 .. n-1`` is a tuple.  Names without a
    separator (every name of a batch of flat spaces) come back as they are, in order."""
    if not any(SEP in k for k in flat):
        return dict(flat)
    tree: dict[str, Any] = {}
    for name, value in flat.items():
        *heads, last = name.split(SEP)
        node = tree
        for h in heads:
            child = node.setdefault(h, {})
            if not isinstance(child, dict):
                raise ValueError(f"array {name!r} lies under array {h!r}: names must not nest")
            node = child
        if last in node:
            raise ValueError(f"array {name!r} is also a group of arrays: names must not nest")
        node[last] = value
    return _tuples(tree)


def _tuples(node: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in node.items():
        if isinstance(v, dict):
            v = _tuples(v)
            if v and set(v) == {str(i) for i in range(len(v))}:
                v = tuple(v[str(i)] for i in range(len(v)))
        out[k] = v
    return out


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The inverse of :func:`nest`: ``{path: leaf}`` (tuples by index)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        name = join(prefix, str(k))
        if isinstance(v, Mapping):
            out.update(flatten(v, name))
        elif isinstance(v, tuple):
            out.update(flatten({str(i): x for i, x in enumerate(v)}, name))
        else:
            out[name] = v
    return out


def iter_leaves(tree: Any) -> Iterator[Any]:
    """The leaves of a nest of dicts and tuples, in order (a leaf is itself)."""
    if isinstance(tree, Mapping):
        for v in tree.values():
            yield from iter_leaves(v)
    elif isinstance(tree, tuple):
        for v in tree:
            yield from iter_leaves(v)
    else:
        yield tree


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    """``tree`` with ``fn`` applied to every leaf (dicts stay dicts, tuples tuples)."""
    if isinstance(tree, Mapping):
        return {k: tree_map(fn, v) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(tree_map(fn, v) for v in tree)
    return fn(tree)


def select(names: Iterable[str], keys: Sequence[str]) -> list[str]:
    """The array names that ``keys`` ask for: a key names an array or a group of them
    (``"observation"`` selects every ``observation/...``).  A key that names nothing is kept,
    so that the reader reports it missing."""
    names = list(names)
    out: list[str] = []
    for key in keys:
        key = key.rstrip(SEP)
        under = [n for n in names if n.startswith(key + SEP)]
        out.extend(under if key not in names and under else [key])
    return list(dict.fromkeys(out))
