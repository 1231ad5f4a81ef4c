"""How ``daskrl ... --help`` reads: every option's default shown, and paragraphs kept.

:class:`HelpFormatter` adds ``(default: X)`` to an option whose help does not say its default
already, except where there is nothing to say (``None``, off, an empty list): no "default:
None" noise. Descriptions and epilogs are wrapped line by line, so the exit-status table keeps
its rows.
"""

from __future__ import annotations

import argparse
import re
import textwrap

__all__ = ["HelpFormatter", "shows_default"]

_ROW = re.compile(r"\S+ {2,}")


def shows_default(action: argparse.Action) -> bool:
    """Whether ``action``'s default is worth stating: not ``None``, off, empty or hidden."""
    default = action.default
    if default is None or default is False or default == argparse.SUPPRESS:
        return False
    if isinstance(default, (list, tuple, dict)) and not default:
        return False
    return action.option_strings != [] or action.nargs in (argparse.OPTIONAL,
                                                            argparse.ZERO_OR_MORE)


class HelpFormatter(argparse.HelpFormatter):
    """The ``daskrl`` command's help formatter (see the module docstring)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or not shows_default(action):
            return text
        return f"{text} (default: %(default)s)"

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines = []
        for line in text.splitlines():
            body = line.lstrip(" ")
            hang = " " * (len(line) - len(body))
            row = _ROW.match(body)  # a table row ("1    runtime error: ...") wraps under its text
            more = hang + " " * (len(row.group(0)) if row else 0)
            lines.append(textwrap.fill(body, width, initial_indent=indent + hang,
                                       subsequent_indent=indent + more) if body else "")
        return "\n".join(lines)
