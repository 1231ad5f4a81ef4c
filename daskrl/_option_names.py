"""Option names that changed: removed options and why, renamed ones and their new name, and
the check that names an unknown keyword and the option it may have meant."""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from daskrl.errors import ConfigError

__all__ = ["REMOVED_OPTIONS", "RENAMED_OPTIONS", "check_names", "renamed_options"]

REMOVED_OPTIONS: dict[str, str] = {
    "batches_per_task": "each stream is one long-lived task that collects batch after batch, so "
                        "there is no per-task cost left to spread over several batches: drop the "
                        "option (docs/collecting.md, \"Streams\")",
}
"""Options of earlier daskrl versions, and why they are gone."""

RENAMED_OPTIONS: dict[str, str] = {"sync": "rounds"}
"""Deprecated option names, and the option each is an alias of (it says "rounds", not a kind
of client)."""


def check_names(options: Mapping[str, Any], names: Sequence[str], owner: str) -> None:
    """Refuse a removed option, or a name not in ``names``, with what to do instead (``owner``
    names what was given them, for the message)."""
    for name in options:
        if name in REMOVED_OPTIONS:
            raise ConfigError(f"{name} is no longer an option: {REMOVED_OPTIONS[name]}.")
        if name not in names and name not in RENAMED_OPTIONS:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{name!r} is not a {owner} option.{hint} The options are "
                              "CollectorConfig's fields (docs/collecting.md).")


def renamed_options(options: Mapping[str, Any], stacklevel: int = 2) -> dict[str, Any]:
    """``options`` with each deprecated name (:data:`RENAMED_OPTIONS`) replaced by the
    option's name, with a :class:`DeprecationWarning` (at ``stacklevel``, counted from the
    caller); :class:`ConfigError` where both names are given."""
    out = dict(options)
    for old, new in RENAMED_OPTIONS.items():
        if old not in out:
            continue
        if new in out:
            raise ConfigError(f"{old}= and {new}= are the same option: give {new}= only.")
        warnings.warn(f"the option {old}= is deprecated: use {new}= (same meaning).",
                      DeprecationWarning, stacklevel=stacklevel + 1)
        out[new] = out.pop(old)
    return out
