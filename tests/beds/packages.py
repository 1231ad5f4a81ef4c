"""The Debian packages a test bed runs: found, or installed by the bed itself where it can.

A newcomer's ``python -m pytest -q`` (the README's second command) starts the SLURM bed and
the namespace hosts as root on a fresh machine, where nobody installed their packages. A bed
calls :func:`ensure_commands` before it starts: commands that are missing are installed from
Debian's packages when this process is root and has ``apt-get`` (one ``apt-get update``, then
``apt-get install``, under a machine-wide lock, so parallel test processes install one at a
time), and otherwise the bed fails with the command line that would install them.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Mapping

SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
"""Where commands are looked for (daemons live in /usr/sbin, which a non-login root shell may
not have on PATH)."""

LOCK = "/tmp/daskrl-test-bed-apt.lock"
INSTALL_TIMEOUT_S = 900.0
"""An ``apt-get update`` and an install of the SLURM packages take about a minute here; this
bounds a mirror that stalls."""


class BedPackagesMissing(RuntimeError):
    """A bed's commands are missing and could not be installed here."""


def missing(commands: Mapping[str, str]) -> list[str]:
    """The commands of ``commands`` (command -> Debian package) not found on this machine."""
    return [c for c in commands if shutil.which(c, path=SEARCH_PATH) is None]


def ensure_commands(bed: str, commands: Mapping[str, str]) -> None:
    """Make sure every command of ``commands`` (command -> its Debian package) is here,
    installing the missing ones' packages as root with apt-get; raise
    :class:`BedPackagesMissing` naming what to install where that cannot be done."""
    if not missing(commands):
        return
    with open(LOCK, "a") as lock:  # another test process may be installing right now
        fcntl.flock(lock, fcntl.LOCK_EX)
        absent = missing(commands)
        if not absent:
            return
        packages = sorted({commands[c] for c in absent})
        todo = f"apt-get install -y {' '.join(packages)}"
        apt = shutil.which("apt-get", path=SEARCH_PATH)
        if os.geteuid() != 0 or apt is None:
            why = "not root" if os.geteuid() != 0 else "no apt-get"
            raise BedPackagesMissing(f"the {bed} test bed needs {absent}, and cannot install "
                                     f"them here ({why}): {todo}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for args in ([apt, "update"],
                     [apt, "install", "-y",
                      "-o", "DPkg::Lock::Timeout=300", *packages]):
            try:
                out = subprocess.run(args, capture_output=True, text=True, env=env,
                                     timeout=INSTALL_TIMEOUT_S)
            except subprocess.TimeoutExpired as e:
                raise BedPackagesMissing(f"the {bed} test bed needs {absent}: "
                                         f"{' '.join(args)} took over {e.timeout:g}s; {todo}"
                                         ) from e
            if out.returncode:
                raise BedPackagesMissing(
                    f"the {bed} test bed needs {absent}: {' '.join(args)} exited with "
                    f"{out.returncode}:\n{out.stdout[-2000:]}{out.stderr[-2000:]}\n{todo}")
        still = missing(commands)
        if still:
            raise BedPackagesMissing(f"the {bed} test bed still misses {still} after {todo}")
