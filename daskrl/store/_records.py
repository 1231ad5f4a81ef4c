"""Checks of the JSON documents a reader finds in a store: root, run and commit records.

A store may come from anywhere, so a document is accepted only with the fields and types of
``docs/store-format.md``; a commit record's ``path`` must name an attempt of the record's own
batch id (``batches/<id:012d>-<attempt>.zip``, or a 1.x attempt directory without ``.zip``),
never another batch's container or anything outside ``batches/``.  A refusal is a
:class:`~daskrl.StoreFormatError` naming the document and what is wrong with it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from daskrl.errors import StoreFormatError

__all__ = ["ATTEMPT_PATH", "check_attempt_path", "check_commit_record", "check_run_record",
           "parse_document"]

ATTEMPT_PATH = re.compile(r"batches/(\d{12})-[0-9A-Za-z]+(?:\.zip)?")
"""The only form of a commit record's ``path``: an attempt of the record's batch."""

_INT_FIELDS = ("batch_id", "frames", "weights_version")
_STR_FIELDS = ("path", "worker", "device")
_OPTIONAL_NUMBERS = ("rollout_seconds", "write_seconds")


def parse_document(raw: bytes, where: str) -> dict[str, Any]:
    """The JSON object ``raw`` (a zarr v3 group or array document) read from ``where``."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise StoreFormatError(f"{where} is not valid JSON ({e}); the file is damaged or was "
                               "not written by daskrl. Restore it from a copy or remove it.") from None
    if not isinstance(doc, dict):
        raise StoreFormatError(f"{where} holds a JSON {type(doc).__name__}, expected an object "
                               "(a zarr v3 group document)")
    return doc


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any) -> bool:
    return (_int(v) or isinstance(v, float)) and not isinstance(v, bool)


def _attributes(doc: dict[str, Any], where: str) -> dict[str, Any]:
    if doc.get("zarr_format") != 3 or doc.get("node_type") != "group":
        raise StoreFormatError(f"{where} is not a zarr v3 group document (zarr_format "
                               f"{doc.get('zarr_format')!r}, node_type {doc.get('node_type')!r})")
    attrs = doc.get("attributes", {})
    if not isinstance(attrs, dict):
        raise StoreFormatError(f"{where}: attributes is a {type(attrs).__name__}, expected an "
                               "object")
    return attrs


def check_attempt_path(path: Any, batch_id: int | None, where: str) -> str:
    """``path`` if it names an attempt of ``batch_id`` (any batch when None), else refuse."""
    m = ATTEMPT_PATH.fullmatch(path) if isinstance(path, str) else None
    if m is None or (batch_id is not None and int(m.group(1)) != batch_id):
        want = f"batches/{batch_id:012d}-<attempt>.zip" if batch_id is not None else \
            "batches/<batch_id:012d>-<attempt>.zip"
        raise StoreFormatError(
            f"{where}: path {path!r} is not an attempt of this batch (expected {want}); daskrl "
            "reads only the record's own container, never another batch's or a file outside "
            "batches/"
        )
    return path


def check_commit_record(doc: dict[str, Any], batch_id: int, where: str) -> dict[str, Any]:
    """The attributes of a commit record of batch ``batch_id``, checked (see module doc)."""
    attrs = _attributes(doc, where)
    for key in (*_INT_FIELDS, *_STR_FIELDS, "episode_returns", "episode_lengths"):
        if key not in attrs:
            raise StoreFormatError(f"{where} lacks {key!r}; a commit record holds "
                                   f"{sorted((*_INT_FIELDS, *_STR_FIELDS))} and more")
    bad = [k for k in _INT_FIELDS if not _int(attrs[k]) or attrs[k] < 0]
    bad += [k for k in _STR_FIELDS if not isinstance(attrs[k], str)]
    bad += [k for k in _OPTIONAL_NUMBERS if k in attrs and not _number(attrs[k])]
    bad += [k for k in ("env_restarts", "env") if k in attrs and not (_int(attrs[k])
                                                                      and attrs[k] >= 0)]
    shape = attrs.get("shape", [0, 0])
    if not (isinstance(shape, list) and len(shape) == 2 and all(_int(n) and n >= 0 for n in shape)):
        bad.append("shape")
    rets, lens = attrs["episode_returns"], attrs["episode_lengths"]
    if not (isinstance(rets, list) and all(_number(r) for r in rets)):
        bad.append("episode_returns")
    if not (isinstance(lens, list) and all(_int(n) and n >= 0 for n in lens)):
        bad.append("episode_lengths")
    stats = attrs.get("episode_stats", [])  # (r, l, t) per episode, since format 2.2
    if not (isinstance(stats, list) and all(
            isinstance(s, list) and len(s) == 3 and _number(s[0]) and _int(s[1]) and s[1] >= 0
            and _number(s[2]) for s in stats)):
        bad.append("episode_stats")
    if bad:
        shown = repr({k: attrs.get(k) for k in bad})[:300]
        raise StoreFormatError(f"{where}: field(s) {bad} have the wrong type or value ({shown})")
    if attrs["batch_id"] != batch_id:
        raise StoreFormatError(f"{where}: batch_id is {attrs['batch_id']}, but the record is "
                               f"that of batch {batch_id}")
    check_attempt_path(attrs["path"], batch_id, where)
    return attrs


def check_run_record(doc: dict[str, Any], run: int, where: str) -> dict[str, Any]:
    """The attributes of run record ``run``, checked: ``settings`` an object (its
    ``reset_at_each_iter`` a bool where present), ``run`` and ``started`` numbers where
    present, ``resumes`` (where present) an earlier run's number."""
    attrs = _attributes(doc, where)
    bad = []
    settings = attrs.get("settings", {})
    if not isinstance(settings, dict):
        bad.append("settings")
    elif not isinstance(settings.get("reset_at_each_iter", False), bool):  # read by episodes
        bad.append("settings.reset_at_each_iter")
    if "run" in attrs and attrs["run"] != run:
        bad.append("run")
    started = attrs.get("started", 0.0)
    if not _number(started) or not math.isfinite(started):
        bad.append("started")
    resumes = attrs.get("resumes")  # the run this one continues: an earlier one
    if resumes is not None and not (_int(resumes) and 0 <= resumes < run):
        bad.append("resumes")
    if bad:
        raise StoreFormatError(f"{where}: field(s) {bad} have the wrong type or value")
    return attrs
