"""``daskrl info``: a cluster's workers, the device each would collect on, and package
versions next to this machine's (exit status 3, a configuration error, when they differ or a
device is unusable: ``daskrl collect`` would refuse such workers)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any, cast

from daskrl.cli._exit import CONFIG, OK
from daskrl.cli._target import add_cluster_args, deployment
from daskrl.deploy import connect, worker_report
from daskrl.deploy._package_versions import (
    CHECKED_PACKAGES,
    format_table,
    version_differences,
)

__all__ = ["add_info_command", "run_info"]


def add_info_command(sub: Any) -> None:
    """Add ``info`` to the ``daskrl`` subparsers ``sub``."""
    i = sub.add_parser("info", help="show a cluster's workers, devices and package versions",
                       description="Show a cluster's workers, the device each would collect "
                       "on, and package versions next to this machine's. Exit status 3 (a "
                       "configuration error) when a worker's versions differ or its device "
                       "cannot be used.")
    add_cluster_args(i)


def _package_rows(versions: Mapping[str, Any], diffs: dict[str, dict[str, str]]) -> list[list[str]]:
    mine = versions["client"]["packages"]
    rows = []
    for pkg in CHECKED_PACKAGES:
        seen: dict[str, int] = {}
        for info in versions["workers"].values():
            v = (info or {}).get("packages", {}).get(pkg) or "not installed"
            seen[v] = seen.get(v, 0) + 1
        workers = ", ".join(f"{v} ({n})" for v, n in sorted(seen.items())) or "-"
        same = all(pkg not in d for d in diffs.values())
        rows.append([pkg, mine.get(pkg) or "not installed", workers,
                     "ok" if same else "DIFFERS"])
    return rows


def run_info(args: argparse.Namespace) -> int:
    """Run ``daskrl info``; the exit status."""
    d = deployment(args) or connect("local")
    try:
        client = d.client
        if hasattr(d.cluster, "job_script"):  # a dask-jobqueue cluster: show its job
            print(f"job script:\n{d.cluster.job_script()}")
        report = worker_report(client)
        versions = cast("Mapping[str, Any]", client.get_versions(packages=list(CHECKED_PACKAGES)))
        address = getattr(client.scheduler, "address", "?")  # the address connected to
        print(f"scheduler: {address}  ({len(report)} workers)\n")
        cols = ["worker", "name", "threads", "device", "DASKRL_DEVICE", "CUDA_VISIBLE_DEVICES"]
        rows = [[addr, *(r[c] or "-" for c in cols[1:])] for addr, r in report.items()]
        print(format_table(cols, rows))
        diffs = version_differences(versions)
        print()
        print(format_table(["package", "this machine", "workers (count)", ""],
                           _package_rows(versions, diffs)))
        bad_devices = [a for a, r in report.items() if r["device"].startswith("error")]
        if diffs or bad_devices:
            print(f"\n{len(diffs)} worker(s) with other versions, {len(bad_devices)} with an "
                  "unusable device.", file=sys.stderr)
            return CONFIG
        return OK
    finally:
        d.close()
