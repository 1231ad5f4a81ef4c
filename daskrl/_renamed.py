"""Attributes kept under an old name, so that code written against it keeps working."""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["Renamed"]


class Renamed:
    """A read-only attribute kept under its old name: reading it gives the attribute it was
    renamed to, with a :class:`DeprecationWarning` that names the new one.

    >>> class Config:
    ...     rounds = True
    ...     sync = Renamed("rounds")
    """

    def __init__(self, new: str) -> None:
        self.new = new
        self.old = self.owner = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.owner, self.old = owner.__name__, name

    def __get__(self, obj: object, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        warnings.warn(f"{self.owner}.{self.old} is deprecated: use {self.owner}.{self.new} "
                      "(same value).", DeprecationWarning, stacklevel=2)
        return getattr(obj, self.new)
