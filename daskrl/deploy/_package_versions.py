"""Package versions: the check between the learner and its workers.

("Version" here means a package's version, not a weights version.)

A worker that unpickles a policy or an env spec with another torch, gymnasium or daskrl than the
learner fails in ways far from the cause (or, worse, collects slightly different data).  A
collector checks the packages below at start and fails with a table of what differs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, cast

from distributed import Client

from daskrl.errors import ClusterError, VersionMismatchError

__all__ = ["CHECKED_PACKAGES", "acheck_versions", "check_versions", "format_table",
           "version_differences", "version_table"]

CHECKED_PACKAGES: tuple[str, ...] = (
    "daskrl", "torch", "gymnasium", "zarr", "numpy", "distributed", "cloudpickle",
)
"""Packages that must be the same version on the learner and on every worker."""

WAIT_FOR_WORKERS_S = 120.0
"""How long a collector waits for its first worker (a batch-queued cluster starts empty)."""

_MISSING = "not installed"


def version_differences(
    versions: Mapping[str, Any], packages: Sequence[str] = CHECKED_PACKAGES
) -> dict[str, dict[str, str]]:
    """``{worker: {package: its version}}`` for every worker whose versions differ from the
    client's, as found in a ``Client.get_versions()`` result (``"client"`` and ``"workers"``).
    Only differing packages are listed; a package missing on one side counts as different.
    """
    mine = versions["client"]["packages"]
    out: dict[str, dict[str, str]] = {}
    for worker, info in sorted(versions.get("workers", {}).items()):
        theirs = (info or {}).get("packages", {})
        diff = {
            p: theirs.get(p) or _MISSING
            for p in packages
            if (theirs.get(p) or _MISSING) != (mine.get(p) or _MISSING)
        }
        if diff:
            out[worker] = diff
    return out


def version_table(
    versions: Mapping[str, Any], packages: Sequence[str] = CHECKED_PACKAGES
) -> str:
    """A plain-text table: one row per differing package, the learner's version, then each
    differing worker's.  Empty when all workers match the learner."""
    diffs = version_differences(versions, packages)
    if not diffs:
        return ""
    mine = versions["client"]["packages"]
    rows_pkgs = [p for p in packages if any(p in d for d in diffs.values())]
    header = ["package", "learner", *diffs]
    rows = [
        [p, mine.get(p) or _MISSING, *(d.get(p, "(same)") for d in diffs.values())]
        for p in rows_pkgs
    ]
    return format_table(header, rows)


def format_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned plain-text columns with a dashed rule under the header."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()
             for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def check_versions(client: Client, packages: Sequence[str] = CHECKED_PACKAGES) -> None:
    """Raise :class:`~daskrl.errors.VersionMismatchError` when a worker's package versions
    differ from this process's.

    Waits up to ``WAIT_FOR_WORKERS_S`` for a first worker when the cluster has none yet (a
    batch-queued cluster starts empty).  Workers that join later are not checked here.
    """
    if not client.scheduler_info()["workers"]:
        client.wait_for_workers(1, timeout=WAIT_FOR_WORKERS_S)
    versions = client.get_versions(packages=list(packages))
    _raise_on_differences(cast("Mapping[str, Any]", versions), packages)


async def acheck_versions(client: Client, packages: Sequence[str] = CHECKED_PACKAGES) -> None:
    """:func:`check_versions` for an asynchronous client (whose methods return awaitables)."""
    if client.scheduler is None:
        raise ClusterError("the client is not connected to a scheduler: start it first "
                           "(await Client(..., asynchronous=True)).")
    info = await client.scheduler.identity(n_workers=-1)
    if not info["workers"]:
        await cast("Awaitable[None]", client.wait_for_workers(1, timeout=WAIT_FOR_WORKERS_S))
    versions = await cast("Awaitable[Mapping[str, Any]]",
                          client.get_versions(packages=list(packages)))
    _raise_on_differences(versions, packages)


def _raise_on_differences(versions: Mapping[str, Any], packages: Sequence[str]) -> None:
    table = version_table(versions, packages)
    if table:
        n = len(version_differences(versions, packages))
        raise VersionMismatchError(
            f"{n} worker(s) run other package versions than the learner:\n{table}\n"
            "Install the same versions on the learner and the workers (one environment or "
            "container image for both), then start the workers again."
        )
