"""A store's root document: creating a new store, and checking an existing one's format.

The root ``zarr.json`` says the hierarchy is a daskrl store (``attributes.daskrl.format``) and
of which format version.  This daskrl reads a store of any version whose major is in
:data:`~daskrl.store._layout.READ_MAJORS` (2.x) and adds runs and batches to it; it creates
stores at :data:`~daskrl.store._layout.FORMAT_VERSION`.
"""

from __future__ import annotations

from daskrl.errors import StoreError, StoreFormatError
from daskrl.store._documents import Documents
from daskrl.store._layout import (
    FORMAT_NAME,
    FORMAT_VERSION,
    OWN_ROOT_NAMES,
    READ_MAJORS,
    ROOT_DOC,
    ROOT_PARTIAL,
    SUBGROUPS,
    group_doc,
    root_attributes,
)

__all__ = ["check_root", "create_root"]


def create_root(docs: Documents, allow_non_empty: bool) -> None:
    """Create the root and its sub-groups if there is no root document (each with an
    exclusive create, so two collectors starting at once make one store)."""
    url = docs.url
    if docs.get(ROOT_DOC) is not None:
        return
    others = _foreign_entries(docs)
    if others and not allow_non_empty:
        shown = ", ".join(repr(n) for n in others[:5]) + (", ..." if len(others) > 5 else "")
        raise StoreError(
            f"cannot create a store at {url!r}: it already holds other things ({shown}) and no "
            "daskrl store. Use a new or empty directory, or, to create the store there on "
            "purpose, TrajectoryStore(url, read_only=False).initialize(allow_non_empty=True) "
            "first."
        )
    try:
        docs.create_exclusive(ROOT_DOC, group_doc(root_attributes()))
        for sub in SUBGROUPS:
            docs.create_exclusive(f"{sub}/zarr.json", group_doc({}))
    except StoreError:
        raise
    except OSError as e:
        raise StoreError(f"cannot create a store at {url!r}: {e}") from e


def _foreign_entries(docs: Documents) -> list[str]:
    """Names at the store's root that are not the store's own (sorted)."""
    try:
        names = docs.backend.list_dir("")
    except OSError:  # not listable: creating it will say what is wrong
        return []
    return sorted(n for n in (k.rstrip("/") for k in names)
                  if n not in OWN_ROOT_NAMES and not ROOT_PARTIAL.fullmatch(n))


def check_root(docs: Documents) -> None:
    """Raise :class:`~daskrl.StoreFormatError` unless the root says this is a daskrl store of a
    format version this daskrl reads."""
    url = docs.url
    root = docs.get(ROOT_DOC, "root record ")
    if root is None:
        raise StoreFormatError(
            f"no daskrl store at {url!r} (no zarr.json at its root). Check the URL, and that "
            "this machine sees the same filesystem as the workers."
        )
    attrs = root.get("attributes")
    info = attrs.get("daskrl") if isinstance(attrs, dict) else None
    if root.get("zarr_format") != 3 or not isinstance(info, dict) or info.get(
            "format") != FORMAT_NAME:
        raise StoreFormatError(
            f"{url!r} is a zarr hierarchy but not a daskrl store "
            f"(root attributes: {root.get('attributes')!r})."
        )
    major = str(info.get("format_version", "")).split(".")[0]
    if major == "1":
        raise StoreFormatError(
            f"store {url!r} has format version {info.get('format_version')!r} (a group "
            "directory per batch, a development format that was never released): it is "
            f"unsupported; this daskrl reads only versions "
            f"{' and '.join(f'{m}.x' for m in READ_MAJORS)} (it writes {FORMAT_VERSION}). "
            "Collect the data again with this daskrl."
        )
    if major not in {str(m) for m in READ_MAJORS}:
        raise StoreFormatError(
            f"store {url!r} has format version {info.get('format_version')!r}; this daskrl "
            f"reads versions {' and '.join(f'{m}.x' for m in READ_MAJORS)}. Upgrade daskrl."
        )
