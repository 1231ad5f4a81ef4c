"""The ``daskrl`` command's exit statuses: which error gives which, and the text ``--help``
shows about them.

The classes answer a script's question "should I fix the command, or look at the run (and
maybe retry)?": a usage or configuration error fails the same way every time until the command
changes; a runtime error happened while the command ran.
"""

from __future__ import annotations

import signal

from daskrl.errors import (
    ConfigError,
    ExportExistsError,
    MissingDependencyError,
    StoreURLError,
    VersionMismatchError,
)

__all__ = ["CONFIG", "EPILOG", "INTERRUPTED", "OK", "RUNTIME", "TERMINATED", "USAGE",
           "status_of"]

OK = 0
"""The command did what it was asked."""
RUNTIME = 1
"""The command started and failed while it ran (or an unexpected error: a bug)."""
USAGE = 2
"""The command line does not parse (argparse's own status)."""
CONFIG = 3
"""The command line parses, but a value in it, or the setup it names, is refused."""
INTERRUPTED = 128 + signal.SIGINT
"""Ctrl-C (SIGINT): 130."""
TERMINATED = 128 + signal.SIGTERM
"""SIGTERM (``kill``, ``scancel``, a batch system ending the job): 143."""

CONFIG_ERRORS: tuple[type[BaseException], ...] = (
    ConfigError, StoreURLError, MissingDependencyError, VersionMismatchError, ExportExistsError)
"""Errors that say the command (or the environment it runs in) must change: rerun as it is,
it fails again. Every other error is a runtime error."""

EPILOG = f"""\
exit status:
  {OK}    success
  {RUNTIME}    runtime error: the command started and failed (an env or policy that raises \
or misbehaves on a worker, a batch past its timeout, store reads or writes, access denied, a \
store that is not there (yet) or is damaged, a cluster that cannot be reached or is lost, \
SLURM refusing or ending the worker jobs), or an \
unexpected error (a bug: --debug shows it in full)
  {USAGE}    usage error: the command line does not parse (an unknown option, a missing or \
malformed value)
  {CONFIG}    configuration error: a value or the setup it names is refused before anything \
is collected (option values and combinations, the env id or its kwargs, the policy factory, \
the store URL or its storage options, an optional extra not installed, workers with other \
package versions, an export target that exists); 'daskrl info' also exits {CONFIG} when a worker's versions differ or its \
device cannot be used
  {INTERRUPTED}  interrupted (Ctrl-C, SIGINT); committed batches stay in the store
  {TERMINATED}  terminated (SIGTERM: kill, scancel); committed batches stay in the store"""
"""What ``daskrl --help`` (and each command's ``--help``) ends with."""


def status_of(e: BaseException) -> int:
    """The exit status for an error that ended a command (see :data:`EPILOG`)."""
    if isinstance(e, KeyboardInterrupt):
        return INTERRUPTED
    return CONFIG if isinstance(e, CONFIG_ERRORS) else RUNTIME
