"""``daskrl.store._handles.BatchHandle``, the name pickles of earlier releases and daskrl's own
modules import the handle by: taken from the store module, whose import registers the opener a
handle loads from its URL with (the class is defined in :mod:`._batch_handle`)."""

from __future__ import annotations

from daskrl.store._store import BatchHandle

__all__ = ["BatchHandle"]
