"""The ``daskrl export`` command: a store's episodes in another tool's format (``--minari``: a
Minari dataset, :mod:`daskrl.integrations.minari`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from daskrl.cli._store import json_object

__all__ = ["add_export_command", "run_export"]


def add_export_command(sub: Any) -> None:
    """Add ``export`` to the ``daskrl`` subparsers ``sub``."""
    p = sub.add_parser(
        "export", help="write a store's episodes as a Minari dataset",
        description="Write a store's episodes as a Minari dataset (offline RL, Farama "
                    "Foundation), read back with minari.load_dataset. The data is read from "
                    "the store, not collected again. Needs: pip install \"daskrl[minari]\".")
    p.add_argument("store", help="local path or fsspec URL of the store")
    p.add_argument("--storage-options", type=json_object("--storage-options"), default=None,
                   metavar="JSON",
                   help='JSON object passed to fsspec, e.g. \'{"anon": true}\'')
    p.add_argument("--minari", metavar="NAME", required=True,
                   help="Minari dataset id, (namespace/)name-v<version>, e.g. cartpole/daskrl-v0")
    p.add_argument("--data-path", metavar="DIR", default=None,
                   help="Minari's root directory of datasets (default: MINARI_DATASETS_PATH, "
                        "else ~/.minari/datasets)")
    p.add_argument("--run", type=int, action="append", default=None, metavar="N",
                   help="export this run only; repeat for several (default: every run, which "
                        "must have collected the same env)")
    p.add_argument("--cut", choices=("drop", "truncate"), default="drop",
                   help="episodes still running when the collection stopped: leave them out, "
                        "or export them with truncations[-1] = True (default: drop)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a dataset of that id (default: refuse)")
    p.add_argument("--env", metavar="ID", default=None,
                   help="gymnasium id of the env the data came from (default: the one the runs "
                        "recorded; needed for runs collected with an env factory)")
    p.add_argument("--env-kwargs", type=json_object("--env-kwargs"), default=None, metavar="JSON",
                   help="JSON object of the env's keyword arguments, if the collection passed "
                        "some (they are not recorded with the run)")
    for flag, what in (("--author", "author's name"), ("--author-email", "author's email"),
                       ("--code-permalink", "a link to the code that collected the data"),
                       ("--algorithm-name", "the algorithm that trained the policy"),
                       ("--description", "a description (default: one naming the store, env "
                                         "and runs)")):
        p.add_argument(flag, default=None, metavar="TEXT", help=f"dataset metadata: {what}")
    p.add_argument("--json", action="store_true", help="print what was written as JSON")


def run_export(args: argparse.Namespace) -> int:
    """Run ``daskrl export``."""
    from daskrl.integrations.minari import export_minari

    r = export_minari(
        args.store, args.minari, runs=args.run, data_path=args.data_path, cut=args.cut,
        overwrite=args.overwrite, env=args.env, env_kwargs=args.env_kwargs,
        storage_options=args.storage_options, author=args.author,
        author_email=args.author_email, code_permalink=args.code_permalink,
        algorithm_name=args.algorithm_name, description=args.description)
    if args.json:
        print(json.dumps(dataclasses.asdict(r)))
        return 0
    runs = ", ".join(map(str, r.runs))
    print(f"exported {r.episodes} episodes ({r.steps} steps) of run(s) {runs} as the Minari "
          f"dataset {r.dataset_id!r}: {r.path}")
    if r.cut_truncated:
        print(f"{r.cut_truncated} episodes still running when the collection stopped end "
              "truncated")
    if r.cut_dropped:
        print(f"left out {r.cut_dropped} episodes still running when the collection stopped "
              "(--cut truncate exports them as truncated)")
    if r.partial_skipped:
        print(f"left out {r.partial_skipped} episodes with steps in deleted batches")
    return 0
