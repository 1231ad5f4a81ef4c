"""Every name and path inside a store (format 2.x, see ``docs/store-format.md``), in one place.

::

    <root>/zarr.json                        group; attributes["daskrl"] = format and version
    <root>/runs/<run:04d>/zarr.json         one group per collector run (its settings)
    <root>/runs/probe-<probe>/...           reachability markers (before a run is registered)
    <root>/runs/weights-<collector>/v<version>-<nonce>
                                            a weights version (``weights_in_store``), while
                                            its collector runs
    <root>/batches/<id:012d>-<attempt>.zip  one zip container per write attempt
    <root>/commits/<id:012d>/zarr.json      commit record: which attempt is *the* batch

Pure functions and constants only: no I/O.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from typing import Any

__all__ = [
    "ASIDE",
    "ATTEMPT_NAME",
    "BATCHES",
    "BATCH_IDS_PER_RUN",
    "COMMITS",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "GROUP_DOC",
    "MAX_RUNS",
    "OWN_PARTIAL",
    "OWN_ROOT_NAMES",
    "READ_MAJORS",
    "ROOT_DOC",
    "ROOT_PARTIAL",
    "RUNS",
    "SUBGROUPS",
    "attempt_path",
    "batch_id_of",
    "commit_dir",
    "commit_key",
    "commit_key_of_attempt",
    "group_doc",
    "is_commit_name",
    "probe_dir",
    "probe_key",
    "root_attributes",
    "run_key",
    "run_of",
    "weights_dir",
    "weights_key",
]

FORMAT_NAME = "daskrl.trajectories"
FORMAT_VERSION = "2.2"
READ_MAJORS = (2,)
"""Major format versions this daskrl reads; it writes only :data:`FORMAT_VERSION`'s."""
BATCH_IDS_PER_RUN = 1_000_000_000
"""Run ``r`` numbers its batches from ``r * BATCH_IDS_PER_RUN``."""
MAX_RUNS = -(-(2**39) // BATCH_IDS_PER_RUN)
"""Runs a store can number (550): batch ids stay below ``2**39``, so that episode ids
(``batch_id * 2**24 + ...``) fit a signed 64-bit integer."""

GROUP_DOC = "zarr.json"
"""Name of a group's (or array's) document."""
ROOT_DOC = GROUP_DOC
RUNS, BATCHES, COMMITS = "runs", "batches", "commits"
SUBGROUPS = (RUNS, BATCHES, COMMITS)
"""The store's own trees: garbage collection and listings touch only these."""

OWN_ROOT_NAMES = frozenset({GROUP_DOC, *SUBGROUPS, "lost+found"})
"""What may be at the root of a directory a new store is created in (``lost+found``: the
root of a fresh filesystem)."""
ROOT_PARTIAL = re.compile(r"zarr\.[0-9a-f]{32}\.partial")
"""A temporary file of an interrupted write of the root's document."""
OWN_PARTIAL = re.compile(r"(?:(?:runs|batches|commits)/(?:[^/]+/)*)?[^/]+\.[0-9a-f]{32}\.partial")
"""Temporary files daskrl (and zarr's ``LocalStore``) leave when a local write is cut:
``<name>.<32 hex>.partial``, at the root or under ``runs/``, ``batches/``, ``commits/``."""
ATTEMPT_NAME = re.compile(r"\d{12}-[0-9A-Za-z]+(?:\.zip)?")
"""Name of an attempt under ``batches/``: ``<id:012d>-<attempt>.zip`` (2.x) or a 1.x
directory ``<id:012d>-<attempt>``."""
ASIDE = ".gc"
"""Suffix of a container a collector renamed aside before deleting it (local stores)."""


def group_doc(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """A zarr v3 group document with ``attributes``."""
    return {"zarr_format": 3, "node_type": "group", "attributes": dict(attributes)}


def root_attributes() -> dict[str, Any]:
    """The root group's attributes of a new store."""
    return {"daskrl": {"format": FORMAT_NAME, "format_version": FORMAT_VERSION}}


def run_key(run: int) -> str:
    return f"{RUNS}/{run:04d}/{GROUP_DOC}"


def run_of(batch_id: int) -> int:
    """The run that numbered ``batch_id``."""
    return batch_id // BATCH_IDS_PER_RUN


def commit_dir(batch_id: int) -> str:
    return f"{COMMITS}/{batch_id:012d}"


def commit_key(batch_id: int) -> str:
    """Key of batch ``batch_id``'s commit record."""
    return f"{commit_dir(batch_id)}/{GROUP_DOC}"


def is_commit_name(name: str) -> bool:
    """Whether ``name`` (listed under ``commits/``) is a batch's directory (12 digits; debris
    such as ``zarr.<hex>.partial`` is not)."""
    return name.isdigit() and len(name) == 12


def attempt_path(batch_id: int) -> str:
    """A fresh attempt name for batch ``batch_id``'s container."""
    return f"{BATCHES}/{batch_id:012d}-{uuid.uuid4().hex[:12]}.zip"


def batch_id_of(path: str) -> int | None:
    """Batch id of an attempt path ``batches/<id:012d>-<attempt>[.zip]`` (None for others)."""
    parts = path.split("/")
    if len(parts) == 2 and parts[0] == BATCHES and parts[1][:12].isdigit():
        return int(parts[1][:12])
    return None


def commit_key_of_attempt(path: str) -> str:
    """Key of the commit record that would name the attempt ``path``."""
    return f"{COMMITS}/{path.split('/')[1][:12]}/{GROUP_DOC}"


def probe_dir(probe: str) -> str:
    return f"{RUNS}/probe-{probe}"


def probe_key(probe: str, name: str) -> str:
    """Key of ``name``'s reachability marker (a worker address made path-safe)."""
    slug = "".join(c if c.isalnum() else "-" for c in name)
    return f"{probe_dir(probe)}/{slug}/{GROUP_DOC}"


def weights_dir(collector: str) -> str:
    """Where collector ``collector`` keeps its weights versions (``weights_in_store``)."""
    return f"{RUNS}/weights-{collector}"


def weights_key(collector: str, version: int, nonce: str) -> str:
    """Key of one weights version of ``collector`` (``nonce``: hex, new per write)."""
    return f"{weights_dir(collector)}/v{version}-{nonce}"
