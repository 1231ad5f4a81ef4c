"""Store subcommands of the ``daskrl`` command: ``inspect``, ``gc`` and ``prune``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from daskrl.errors import MissingDependencyError
from daskrl.store._housekeeping import DEFAULT_GRACE_SECONDS

__all__ = ["add_store_commands", "run_store_command"]


def json_object(flag: str) -> Any:
    """An argparse type: the option's value parsed as a JSON object (a dict)."""
    def parse(text: str) -> dict[str, Any]:
        try:
            value = json.loads(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{flag} takes a JSON object: {e}") from None
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(f"{flag} takes a JSON object, got {text!r}")
        return value

    return parse


_options = json_object("--storage-options")


def add_store_commands(sub: Any) -> None:
    """Add ``inspect``, ``gc`` and ``prune`` to the ``daskrl`` subparsers ``sub``."""
    def store_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("store", help="local path or fsspec URL of the store")
        p.add_argument("--storage-options", type=_options, default=None,
                       metavar="JSON",
                       help='JSON object passed to fsspec, e.g. \'{"anon": true}\' '
                            "(default: none; a local path takes none)")

    i = sub.add_parser("inspect", help="summarize a store",
                       description="Print a store's batches, frames, episodes, returns, "
                                   "weights versions, bytes on disk and compression ratio.")
    store_args(i)
    i.add_argument("--plot", metavar="PNG", default=None,
                   help="also write a PNG of episode returns against the frame where each "
                        "episode ended, one colour per run, and frames/s per worker "
                        "(needs matplotlib: pip install \"daskrl[plot]\")")
    i.add_argument("--json", action="store_true",
                   help="print the summary as one JSON object instead of text")
    g = sub.add_parser("gc", help="delete debris of crashed writers",
                       description="Delete uncommitted write attempts and *.partial files older "
                                   "than a grace period; committed batches are never touched.")
    store_args(g)
    g.add_argument("--older-than", type=float, default=DEFAULT_GRACE_SECONDS, metavar="SECONDS",
                   help="delete only debris older than this: the grace period for writers "
                        "still running")
    g.add_argument("--dry-run", action="store_true",
                   help="only report what would be deleted, delete nothing")
    p = sub.add_parser("prune", help="delete all but the newest batches",
                       description="Delete committed batches, keeping the N with the highest "
                                   "ids (commit record first, then data).")
    store_args(p)
    p.add_argument("--keep-last", type=int, required=True, metavar="N",
                   help="how many batches to keep, those with the highest ids (required)")


def run_store_command(args: argparse.Namespace) -> int | None:
    """Run a store subcommand; None if ``args.command`` is not one."""
    if args.command not in ("inspect", "gc", "prune"):
        return None
    from daskrl.store._store import open_store

    store = open_store(args.store, args.storage_options, writable=args.command != "inspect")
    if args.command == "inspect":
        from daskrl.data._inspect import format_summary, summarize
        from daskrl.data._plot import plot_returns

        if args.plot:  # fail on a missing matplotlib before the (slower) summary
            try:
                import matplotlib  # noqa: F401
            except ImportError as e:
                raise MissingDependencyError(
                    f"--plot needs matplotlib, which is not installed ({e}). "
                    'Install it with: pip install "daskrl[plot]"'
                ) from None
        s = summarize(store)
        print(json.dumps(s, indent=1) if args.json else format_summary(s))
        if args.plot:
            print(f"plot: {plot_returns(store, args.plot)}")
        return 0
    if args.command == "gc":
        r = store.collect_garbage(args.older_than, dry_run=args.dry_run)
        verb = "would remove" if args.dry_run else "removed"
        print(f"{verb} {len(r.attempts)} uncommitted attempts and {len(r.partial_files)} "
              f"partial files ({r.bytes} bytes); kept {len(r.kept)} younger than "
              f"{args.older_than:g}s")
        return 0
    deleted = store.keep_last(args.keep_last)
    print(f"deleted {len(deleted)} batches; {len(store)} remain")
    return 0
