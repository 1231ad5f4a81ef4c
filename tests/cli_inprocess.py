"""The ``daskrl`` command run in this process: :func:`daskrl_main` calls ``daskrl.cli.main`` as
``python -m daskrl.cli`` would and returns what a subprocess run returns (a
``subprocess.CompletedProcess``: exit status, stdout, stderr).

A subprocess of the command costs an interpreter start that imports torch (over a second of
CPU) on top of the command itself; tests about the command's parsing, messages, exit statuses
and what it writes run it here. What only a real process shows stays a subprocess test: signals
(SIGINT, SIGTERM), the installed entry point, output streamed to a pipe while the command runs,
a fresh interpreter without an optional package.

In this process pytest's ``filterwarnings = ["error"]`` applies: a warning on the command's path
is an error the command reports (a subprocess would print it and go on).
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess

from daskrl.cli import main

__all__ = ["daskrl_main"]


def daskrl_main(*args: str, cwd: str | os.PathLike[str] | None = None
                ) -> subprocess.CompletedProcess[str]:
    """Run ``daskrl ARGS...`` in this process (in ``cwd`` if given): its exit status (argparse's
    ``SystemExit`` included: 2 for a usage error, 0 for ``--version``), and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(list(args))
            except SystemExit as e:  # argparse: a usage error, --help, --version
                if e.code is None or isinstance(e.code, int):
                    status = e.code or 0
                else:  # a message: Python prints it and exits with 1
                    print(e.code, file=err)
                    status = 1
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(["daskrl", *args], status, out.getvalue(),
                                       err.getvalue())
