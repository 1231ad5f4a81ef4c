"""The ``collect`` command's collection options, generated from :class:`~daskrl.CollectorConfig`.

One flag per config field (except those marked ``metadata["flag"] == "by hand"``, whose flags
the command defines itself, e.g. ``--env-var NAME=VALUE`` for ``env_vars``): its name from the field's (``--frames-per-batch``), its type and
choices from the annotation (an enum's values, a ``Literal``'s members; a ``bool | int``
field is a switch with an optional number, ``--resume [RUN]``; a ``tuple[str, ...]`` field
takes one or more values, ``--info-keys KEY [KEY ...]``), its default from the
field and its help from the field's ``metadata["help"]``. Nothing here repeats a default, so a
new config field gets its flag, and a changed default reaches the command line, by itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import types
import typing
from collections.abc import Callable
from typing import Any

from daskrl.config import CollectorConfig
from daskrl.errors import UsageError

__all__ = ["add_config_options", "config_from_args", "config_options"]

RENAMED = {"total_frames": "--frames", "num_workers": "--workers"}
"""Flags that kept the shorter names they had before they were generated."""
NEGATED = {"rounds": "--no-rounds"}
"""Boolean fields that default to true, and the flag that sets them false."""
ALIASES = {"rounds": ("--async",)}
"""Older flags that still set a field: ``--async`` is ``--no-rounds`` (first finished, first
out), not a kind of client."""
MORE_HELP = {"num_workers": "; with the embedded cluster also its size (one worker per core)"}
"""What a flag does on the command line beyond the config field."""


@dataclasses.dataclass(frozen=True)
class ConfigOption:
    """The argparse form of one :class:`CollectorConfig` field."""

    field: str
    """The config field (and the argparse ``dest``)."""
    flag: str
    """The command-line flag, e.g. ``--frames-per-batch``."""
    kwargs: dict[str, Any]
    """Keyword arguments of ``ArgumentParser.add_argument`` (action, type, choices, ...)."""


def _optional(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type that also takes ``none`` (for an ``X | None`` field)."""
    def parse_or_none(text: str) -> Any:
        return None if text.strip().lower() == "none" else parse(text)

    parse_or_none.__name__ = getattr(parse, "__name__", "value")  # argparse names it in errors
    return parse_or_none


def _default_text(value: Any) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    return "none" if value is None else str(value)


def _kwargs(f: dataclasses.Field[Any], annotation: Any, flag: str) -> dict[str, Any]:
    if f.default is dataclasses.MISSING:
        raise UsageError(f"CollectorConfig.{f.name} has no default; the CLI needs one")
    help_text = f.metadata.get("help")
    if not help_text:
        raise UsageError(f"CollectorConfig.{f.name} has no metadata['help'] for its CLI flag")
    help_text = str(help_text).replace("%", "%%") + MORE_HELP.get(f.name, "")
    default = f.default
    args = typing.get_args(annotation)
    optional = typing.get_origin(annotation) in (typing.Union, types.UnionType) and (
        type(None) in args)
    if optional:
        [annotation] = [a for a in args if a is not type(None)]
    if set(args) == {bool, int}:  # a switch that may name a number: --resume [RUN]
        return {"nargs": "?", "const": True, "default": default, "type": int,
                "metavar": f.metadata.get("metavar", "N"),
                "help": f"{help_text} (default: {'on' if default else 'off'})"}
    if annotation is bool:
        if default:
            return {"action": "store_false", "default": True,
                    "help": f"{help_text} (default: on; {flag} turns it off)"}
        return {"action": "store_true", "default": False, "help": f"{help_text} (default: off)"}
    if typing.get_origin(annotation) is tuple and typing.get_args(annotation) == (str, ...):
        return {"nargs": "+", "default": default, "type": str,
                "metavar": f.metadata.get("metavar", "NAME"),
                "help": f"{help_text} (default: {' '.join(default) or 'none'})"}
    kwargs: dict[str, Any] = {"default": default}
    parse: Callable[[str], Any]
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        kwargs["choices"] = [m.value for m in annotation]
        kwargs["default"] = default.value if isinstance(default, enum.Enum) else default
        parse = str
    elif typing.get_origin(annotation) is typing.Literal:
        kwargs["choices"] = list(typing.get_args(annotation))
        parse = type(kwargs["choices"][0])
    elif annotation in (int, float, str):
        parse = annotation
    else:
        raise UsageError(f"CollectorConfig.{f.name}: no command-line form for {annotation!r}")
    kwargs["type"] = _optional(parse) if optional else parse
    says_default = "(default: " in help_text  # e.g. "(default: the cluster's worker count)"
    kwargs["help"] = help_text if says_default else (
        f"{help_text} (default: {_default_text(default)})")
    if "choices" not in kwargs:
        kwargs["metavar"] = parse.__name__.upper() if not optional else (
            f"{parse.__name__.upper()}|none")
    return kwargs


def config_options() -> list[ConfigOption]:
    """The command-line form of every :class:`CollectorConfig` field, in field order."""
    hints = typing.get_type_hints(CollectorConfig)
    out = []
    for f in dataclasses.fields(CollectorConfig):
        if f.metadata.get("flag") == "by hand":
            continue  # the command defines this flag itself (its own parsing)
        flag = NEGATED.get(f.name) or RENAMED.get(f.name) or "--" + f.name.replace("_", "-")
        out.append(ConfigOption(f.name, flag, _kwargs(f, hints[f.name], flag)))
    return out


def add_config_options(parser: argparse.ArgumentParser) -> None:
    """Add a flag for each :class:`CollectorConfig` field to ``parser`` (one group)."""
    group = parser.add_argument_group("collection (daskrl.CollectorConfig)")
    for option in config_options():
        kwargs = dict(option.kwargs)
        if option.field in MARK_GIVEN:
            kwargs["action"] = _Given
        group.add_argument(option.flag, *ALIASES.get(option.field, ()), dest=option.field,
                           **kwargs)


MARK_GIVEN = ("envs_per_worker",)
"""Fields whose flags also set ``<field>_given`` (a vector env's ``num_envs`` gives
``envs_per_worker`` unless the flag does)."""


class _Given(argparse.Action):
    """Store the value, and ``<dest>_given = True``."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


def config_from_args(args: argparse.Namespace, **by_hand: Any) -> CollectorConfig:
    """The :class:`CollectorConfig` the parsed flags give, with ``by_hand`` the values of the
    fields whose flags the command defines itself (validated: a bad value raises
    :class:`~daskrl.errors.ConfigError` naming the field)."""
    return CollectorConfig(**{o.field: getattr(args, o.field) for o in config_options()},
                           **by_hand)
