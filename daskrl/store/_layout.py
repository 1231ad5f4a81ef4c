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

from daskrl.errors import StoreError

__all__ = [
    "ASIDE",
    "ATTEMPT_NAME",
    "BATCHES",
    "BATCH_IDS_PER_RUN",
    "COMMITS",
    "EPISODE_ID_STRIDE",
    "EXTENDED_BATCH_BITS",
    "EXTENDED_FIRST_RUN",
    "EXTENDED_INDEX_BITS",
    "EXTENDED_RUN_BITS",
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
    "UNUSED_EPISODE_IDS",
    "attempt_path",
    "batch_id_in_run",
    "batch_id_of",
    "batches_per_run",
    "commit_dir",
    "commit_key",
    "commit_key_of_attempt",
    "episode_id_base",
    "episode_origin",
    "group_doc",
    "is_commit_name",
    "probe_dir",
    "probe_key",
    "root_attributes",
    "run_first_batch",
    "run_key",
    "run_of",
    "weights_dir",
    "weights_key",
]

FORMAT_NAME = "daskrl.trajectories"
FORMAT_VERSION = "2.3"
READ_MAJORS = (2,)
"""Major format versions this daskrl reads; it writes only :data:`FORMAT_VERSION`'s."""

# Batch ids and episode ids: two packings, chosen by the run number alone.
#
# Runs 0 to 549 number batch ``i`` as ``run * BATCH_IDS_PER_RUN + i`` and episodes as
# ``batch_id * 2**24 + k`` (``k = s * E + e``: where the episode started in the batch).  Those
# ids can fill every non-negative int64, so no other packing of non-negative ids is sure to
# miss every id a store already holds.  Runs from 550 on, which no daskrl before format 2.3
# could register, number their batches on from ``550 * BATCH_IDS_PER_RUN`` and their
# episodes below ``-2**62``: ``-2**63 + x * 2**25 + k``, ``x`` the batch's index among the
# extended runs' batches.  Bits of such an id above ``-2**63``: 16 for the run, 21 for the
# batch in its run, 25 for ``k``.
BATCH_IDS_PER_RUN = 1_000_000_000
"""Run ``r < EXTENDED_FIRST_RUN`` numbers its batches from ``r * BATCH_IDS_PER_RUN``."""
EPISODE_ID_STRIDE = 1 << 24
"""Episode ids of runs below :data:`EXTENDED_FIRST_RUN`: ``batch_id * EPISODE_ID_STRIDE + k``."""
EXTENDED_FIRST_RUN = -(-(2**39) // BATCH_IDS_PER_RUN)
"""The first run (550) numbered by the extended packing: below it, batch ids stay below
``2**39`` so that ``batch_id * 2**24 + k`` fits a signed 64-bit integer."""
EXTENDED_RUN_BITS = 16
EXTENDED_BATCH_BITS = 21
"""An extended run numbers at most ``2**21`` batches."""
EXTENDED_INDEX_BITS = 25
"""``k = s * E + e <= T * E + E - 1``, below ``2 * 2**24`` since frames per batch stay below
``2**24`` (``config.MAX_FRAMES_PER_BATCH``)."""
UNUSED_EPISODE_IDS = range(-(1 << 62), 0)
"""Episode ids no store holds: a rollout may use them for episodes it has not numbered yet."""
_EXTENDED_FIRST_BATCH = EXTENDED_FIRST_RUN * BATCH_IDS_PER_RUN
_INT64_MIN = -(2**63)
MAX_RUNS = EXTENDED_FIRST_RUN + (1 << EXTENDED_RUN_BITS)
"""Runs a store can number (66,086: runs 0 to 66,085)."""

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
ATTEMPT_NAME = re.compile(r"\d{12}-[0-9A-Za-z]+\.zip")
"""Name of an attempt under ``batches/``: ``<id:012d>-<attempt>.zip``."""
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


def run_first_batch(run: int) -> int:
    """The first batch id of run ``run``."""
    if run < EXTENDED_FIRST_RUN:
        return run * BATCH_IDS_PER_RUN
    return _EXTENDED_FIRST_BATCH + ((run - EXTENDED_FIRST_RUN) << EXTENDED_BATCH_BITS)


def batches_per_run(run: int) -> int:
    """How many batch ids run ``run`` can number (its episode ids must fit 64 bits)."""
    if run < EXTENDED_FIRST_RUN:
        return min(BATCH_IDS_PER_RUN, 2**39 - run * BATCH_IDS_PER_RUN)
    return 1 << EXTENDED_BATCH_BITS


def run_of(batch_id: int) -> int:
    """The run that numbered ``batch_id``."""
    if batch_id < _EXTENDED_FIRST_BATCH:
        return batch_id // BATCH_IDS_PER_RUN
    return EXTENDED_FIRST_RUN + ((batch_id - _EXTENDED_FIRST_BATCH) >> EXTENDED_BATCH_BITS)


def batch_id_in_run(first_id: int, index: int) -> int:
    """Batch id ``first_id + index``, where ``first_id`` is a batch id of a run.

    Raises :class:`~daskrl.errors.StoreError` when the id would lie past the run's
    :func:`batches_per_run`: a run that long must be split (stop, then ``resume``)."""
    run = run_of(first_id)
    batch_id = first_id + index
    if batch_id - run_first_batch(run) >= batches_per_run(run):
        raise StoreError(
            f"run {run} has numbered all the {batches_per_run(run):_} batch ids a run can "
            f"have (its episode ids must fit 64 bits). Close the collector and start a new "
            "one with resume= to go on in a new run."
        )
    return batch_id


def episode_id_base(batch_id: int) -> int:
    """The id of an episode that starts at the beginning of batch ``batch_id`` on env 0.

    The episode that starts at row ``s`` of env ``e`` in a batch of ``E`` envs has id
    ``episode_id_base(batch_id) + s * E + e`` (``s`` up to ``T``: an episode that ended at the
    batch's last step starts the next one there)."""
    if batch_id < _EXTENDED_FIRST_BATCH:
        return batch_id * EPISODE_ID_STRIDE
    return _INT64_MIN + ((batch_id - _EXTENDED_FIRST_BATCH) << EXTENDED_INDEX_BITS)


def episode_origin(episode_id: int) -> tuple[int, int]:
    """``(batch_id, k)`` of an episode id: the batch it started in and ``k = s * E + e``
    (see :func:`episode_id_base`)."""
    if episode_id >= 0:
        return episode_id // EPISODE_ID_STRIDE, episode_id % EPISODE_ID_STRIDE
    x = episode_id - _INT64_MIN
    return (_EXTENDED_FIRST_BATCH + (x >> EXTENDED_INDEX_BITS),
            x & ((1 << EXTENDED_INDEX_BITS) - 1))


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
