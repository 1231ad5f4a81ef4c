"""The ``daskrl`` command line: ``daskrl collect`` runs a collection on the embedded default;
``daskrl info`` shows a cluster; ``daskrl inspect``, ``gc`` and ``prune`` look after a store;
``daskrl export`` writes its episodes in another tool's format.

This module owns the parser, the entry point, the one-line error report and the signal
handling; each command lives in its own module."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import Any

from daskrl.cli._collect import add_collect_command, run_collect
from daskrl.cli._exit import EPILOG, INTERRUPTED, status_of
from daskrl.cli._export import add_export_command, run_export
from daskrl.cli._help import HelpFormatter
from daskrl.cli._info import add_info_command, run_info
from daskrl.cli._store import add_store_commands, run_store_command
from daskrl.errors import DaskrlError

__all__ = ["DESCRIPTION", "error_line", "main"]

DESCRIPTION = ("Collect reinforcement-learning experience on Dask into a zarr store: "
               "'daskrl collect' runs a collection (on an embedded cluster unless told "
               "otherwise); 'daskrl info' shows a cluster; 'daskrl inspect', 'gc' and 'prune' "
               "look after a store; 'daskrl export' writes its episodes as a Minari dataset.")
"""What ``daskrl --help`` says first, as plain text."""


def _parser() -> argparse.ArgumentParser:
    from daskrl import __version__

    p = argparse.ArgumentParser(prog="daskrl", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=HelpFormatter)
    p.add_argument("--version", action="version", version=f"daskrl {__version__}",
                   help="print daskrl's version and exit")
    sub = p.add_subparsers(dest="command", required=True)
    add_collect_command(sub)
    add_info_command(sub)
    add_store_commands(sub)
    add_export_command(sub)
    debug = "on an error, print the full error and its traceback (default: one line)"
    p.add_argument("--debug", action="store_true", help=debug)
    for command in sub.choices.values():  # also after the command: daskrl collect --debug
        command.formatter_class = HelpFormatter
        command.epilog = EPILOG
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help=debug)
    return p


def error_line(e: BaseException) -> str:
    """One line for an error: its message's first line, plus the worker and weights version a
    worker's error names; ``--debug`` shows the rest (the env's or policy's traceback...)."""
    if isinstance(e, DaskrlError) and e.whole_message:
        return str(e)
    lines = [line for line in str(e).splitlines() if line.strip()] or [""]
    text = lines[0]
    where = [line for line in lines[1:] if line.startswith("[worker ")]
    if where:
        text = f"{text} {where[-1]}"
    if not isinstance(e, DaskrlError):
        text = f"{type(e).__name__}: {text}".rstrip(": ")
    if len(lines) > 1 + len(where) or not isinstance(e, (DaskrlError, ValueError)):
        text += " (--debug shows the full error)"
    return text


def _run(args: argparse.Namespace) -> int:
    if args.command == "collect":
        return run_collect(args)
    if args.command == "info":
        return run_info(args)
    if args.command == "export":
        return run_export(args)
    code = run_store_command(args)
    return 1 if code is None else code


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``daskrl`` command.

    Errors print one line (``daskrl: error: ...``); the exit status says which kind of error
    it was (:mod:`daskrl.cli._exit`: 1 runtime, 2 usage, 3 configuration, 130 interrupted, 143
    terminated); ``--debug`` prints the traceback too.
    """
    import dask

    args = _parser().parse_args(argv)
    # SIGTERM (scancel, kill, a batch system ending the job) unwinds like Ctrl-C, so that a
    # SLURM cluster's jobs are cancelled and its TLS key files deleted on the way out.
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if in_main_thread else None
    debug = getattr(args, "debug", False)
    config: dict[str, Any] = {}
    if getattr(args, "no_tls", False):
        config["daskrl.embedded-cluster.tls"] = False
    if not debug:  # a batch's error reaches this process and is printed once, in one line
        config["daskrl.embedded-cluster.log-level"] = "critical"
    try:
        with dask.config.set(config):
            return _run(args)
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print("daskrl: interrupted", file=sys.stderr)
        return INTERRUPTED
    except Exception as e:
        if debug:
            traceback.print_exc()
        print(f"daskrl: error: {error_line(e)}", file=sys.stderr)
        return status_of(e)
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends at once
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
