"""Store URLs and their ``storage_options``: normalized and checked on the learner, before
anything is opened."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fsspec

from daskrl.errors import StoreError, StoreURLError

__all__ = ["check_store_options", "is_local", "local_path", "normalize_url"]


def normalize_url(url: str | os.PathLike[str]) -> str:
    """``file://`` URL of an absolute path for local paths; other URLs unchanged."""
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str) or not url:
        raise StoreURLError(
            f"store must be a local path or an fsspec URL (a non-empty str or os.PathLike), "
            f"got {url!r}. Pass e.g. store='runs/demo' or store='s3://bucket/prefix'."
        )
    if "://" not in url:
        return "file://" + str(Path(url).expanduser().absolute())
    if url.startswith("file://"):
        return "file://" + str(Path(url[len("file://") :]).expanduser().absolute())
    return url.rstrip("/")


def is_local(url: str) -> bool:
    """Whether the (normalized) ``url`` is a local path."""
    return url.startswith("file://")


def local_path(url: str) -> str:
    """The directory of a (normalized) local ``url``."""
    return url[len("file://") :]


def check_store_options(url: str, storage_options: Any) -> dict[str, Any]:
    """Validate ``storage_options`` for the (normalized) store ``url`` and the URL's fsspec
    protocol; return the options as a dict."""
    if storage_options is None:
        storage_options = {}
    if not isinstance(storage_options, Mapping) or not all(
            isinstance(k, str) for k in storage_options):
        raise StoreURLError(
            f"storage_options must be a mapping with string keys (fsspec options such as "
            f"{{'anon': True}}) or None, got {type(storage_options).__name__} "
            f"{storage_options!r}. Parse a JSON text first: json.loads(text)."
        )
    if is_local(url):
        if storage_options:
            raise StoreURLError(
                f"store {url!r} is a local path, which takes no storage_options (they go to "
                f"fsspec backends such as s3://), got {sorted(storage_options)}. Drop them, "
                "or give the store's fsspec URL."
            )
        return {}
    for part in url.split("::"):  # chained URLs: "simplecache::s3://bucket/prefix"
        protocol = part.split("://", 1)[0] if "://" in part else part
        try:
            fsspec.get_filesystem_class(protocol)
        except ImportError as e:
            raise StoreError(
                f"cannot open store {url!r}: {e}. Install the fsspec backend for this protocol "
                "(e.g. pip install s3fs for s3://)."
            ) from e
        except ValueError:
            close = difflib.get_close_matches(protocol, fsspec.available_protocols(), n=3,
                                              cutoff=0.5)
            hint = f"Did you mean {' or '.join(repr(c + '://') for c in close)}? " if close else ""
            raise StoreURLError(
                f"store {url!r} names the unknown fsspec protocol {protocol!r}. {hint}Give a "
                "local path or a URL whose protocol fsspec knows (fsspec.available_protocols())."
            ) from None
    return dict(storage_options)
