"""Several hosts on one machine: network namespaces on a private bridge (root only).

Each host is a network namespace with one veth (``eth0``, ``10.213.7.<10+i>/24``) whose peer
is a port of a bridge that lives in a namespace of its own, so nothing is added to the root
namespace's network and traffic flows only between these hosts. Each host also has its own
hostname (UTS namespace) and a fresh tmpfs on ``/tmp`` and ``/dev/shm`` (mount namespace),
held by one sleeping "holder" process per host that every command on that host joins with
``nsenter``: processes on one host share its ``/tmp`` and ``/dev/shm``, processes on different
hosts do not. One directory is bind-mounted at the same path on every host (and is that path
in the root namespace too) as the shared filesystem. Commands start in ``/``: the caller's
working directory may be hidden under the host's own ``/tmp``.

Names start with ``drl-<pid>-`` so that parallel runs never collide. :meth:`Hosts.close`
kills every process in every namespace and deletes the namespaces (their veths and mounts go
with them); it checks that nothing is left.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from beds.packages import ensure_commands

COMMANDS = {"ip": "iproute2", "tc": "iproute2", "nsenter": "util-linux", "unshare": "util-linux",
            "mount": "mount", "umount": "mount", "ps": "procps"}
"""The commands the bed runs, each with the Debian package that has it (installed by the bed
where it is missing: :mod:`beds.packages`)."""

SUBNET = "10.213.7"
"""A private /24 used only inside the bed's namespaces."""
_COUNTER = itertools.count()

_MOUNT_SCRIPT = r"""
set -e
hostname "$DRL_HOSTNAME"
mount -t tmpfs -o mode=1777,size=2g drl-shm /dev/shm
# The directories every host must see where they are (the shared one; the checkout and the venv
# when they lie under /tmp) are held aside while the host's own /tmp hides the old one.
IFS=:
i=0
for path in $DRL_KEEP; do
    mkdir "/dev/shm/.drl-keep-$i"
    mount --bind "$path" "/dev/shm/.drl-keep-$i"
    i=$((i + 1))
done
mount -t tmpfs -o mode=1777 drl-tmp /tmp
i=0
for path in $DRL_KEEP; do
    mkdir -p "$path"
    mount --move "/dev/shm/.drl-keep-$i" "$path"
    rmdir "/dev/shm/.drl-keep-$i"
    i=$((i + 1))
done
unset IFS
cd /
echo ready
exec sleep infinity
"""

def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def netns_pids(ns: str) -> list[int]:
    """Pids of the processes in network namespace ``ns`` (none if it does not exist)."""
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                         timeout=30)
    return [int(p) for p in out.stdout.split()] if out.returncode == 0 else []


NETNS_DIR = "/run/netns"
"""Where ``ip netns`` keeps its named namespaces."""


def netns_dir_mounted() -> bool:
    """Whether :data:`NETNS_DIR` is a mount point (``ip netns add`` bind-mounts it onto itself,
    which ``os.path.ismount`` cannot see: same device, as its parent)."""
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == NETNS_DIR for line in f)


class Hosts:
    """``n`` namespace hosts sharing ``shared``; use as a context manager."""

    def __init__(self, n: int, shared: Path, prefix: str | None = None) -> None:
        self.n = n
        self.shared = Path(shared).resolve()
        self.prefix = prefix or f"drl-{os.getpid()}-{next(_COUNTER)}-"
        self.bridge_ns = f"{self.prefix}br"
        self.namespaces = [f"{self.prefix}h{i}" for i in range(n)]
        self._holders: list[subprocess.Popen] = []
        self._mounted_netns_dir = False  # `ip netns add` bind-mounted NETNS_DIR for this bed
        self.procs: list[tuple[int, subprocess.Popen]] = []  # (host, process) started here

    # -- set-up --------------------------------------------------------------------------------
    def kept_paths(self) -> list[str]:
        """What every host sees at its own path: the shared directory, and the checkout and the
        venv where they lie under ``/tmp`` (which each host replaces with a tmpfs of its own;
        CI may clone the project there)."""
        code = [Path(__file__).resolve().parents[2], Path(sys.prefix).resolve()]
        keep = [self.shared]
        for path in sorted(code, key=lambda p: len(p.parts)):
            if path.is_relative_to("/tmp") and not any(path.is_relative_to(k) for k in keep):
                keep.append(path)
        return [str(k) for k in keep]

    def address(self, i: int) -> str:
        """Host ``i``'s IPv4 address."""
        return f"{SUBNET}.{10 + i}"

    def hostname(self, i: int) -> str:
        return f"{self.prefix}host{i}"

    def start(self) -> Hosts:
        ensure_commands("namespace hosts", COMMANDS)
        try:
            self._mounted_netns_dir = not netns_dir_mounted()
            _ip("netns", "add", self.bridge_ns)
            _ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.bridge_ns, "link", "set", "br0", "up")
            for i, ns in enumerate(self.namespaces):
                _ip("netns", "add", ns)
                _ip("-n", self.bridge_ns, "link", "add", f"h{i}", "type", "veth",
                    "peer", "name", "eth0", "netns", ns)
                _ip("-n", self.bridge_ns, "link", "set", f"h{i}", "master", "br0", "up")
                _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                self._holders.append(self._start_holder(i, ns))
        except BaseException:
            self.close()
            raise
        return self

    def _start_holder(self, i: int, ns: str) -> subprocess.Popen:
        self.shared.mkdir(parents=True, exist_ok=True)
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
               "DRL_HOSTNAME": self.hostname(i), "DRL_KEEP": ":".join(self.kept_paths())}
        holder = subprocess.Popen(
            ["ip", "netns", "exec", ns, "unshare", "--mount", "--uts", "--propagation",
             "private", "sh", "-c", _MOUNT_SCRIPT],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
            start_new_session=True, cwd="/")
        line = holder.stdout.readline()  # type: ignore[union-attr]
        if line.strip() != b"ready":
            holder.kill()
            _, err = holder.communicate(timeout=10)
            raise RuntimeError(f"host {i} did not start: {err.decode(errors='replace')}")
        return holder

    # -- use -----------------------------------------------------------------------------------
    def command(self, i: int, args: Sequence[str]) -> list[str]:
        """``args`` as a command line that runs on host ``i``, from ``/``."""
        return ["nsenter", "-t", str(self._holders[i].pid), "-m", "-u", "-n", "--",
                "sh", "-c", 'cd / && exec "$@"', "sh", *args]

    def run(self, i: int, args: Sequence[str], *, env: Mapping[str, str] | None = None,
            log: Path | None = None) -> subprocess.Popen:
        """Start ``args`` on host ``i`` in a session of its own (output to ``log``)."""
        out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
        try:
            proc = subprocess.Popen(self.command(i, args), stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, env=dict(env or os.environ),
                                    start_new_session=True)
        finally:
            if log:
                out.close()  # type: ignore[union-attr]
        self.procs.append((i, proc))
        return proc

    def check(self, i: int, args: Sequence[str], timeout: float = 60
              ) -> subprocess.CompletedProcess:
        """Run ``args`` on host ``i`` to the end; its output as text."""
        return subprocess.run(self.command(i, args), capture_output=True, text=True,
                              timeout=timeout)

    def cut(self, i: int) -> None:
        """Take host ``i``'s link down (at the bridge): its packets are dropped, silently."""
        _ip("-n", self.bridge_ns, "link", "set", f"h{i}", "down")

    def restore(self, i: int) -> None:
        """Bring host ``i``'s link back up."""
        _ip("-n", self.bridge_ns, "link", "set", f"h{i}", "up")

    def kill(self, i: int) -> list[int]:
        """SIGKILL every process on host ``i`` (the host itself stays up); their pids."""
        holder = self._holders[i].pid if i < len(self._holders) else None
        victims = [p for p in netns_pids(self.namespaces[i]) if p != holder]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for host, proc in self.procs:
            if host == i:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
        return victims

    # -- tear-down -----------------------------------------------------------------------------
    def close(self) -> None:
        """Kill everything on every host, delete every namespace; check nothing is left."""
        all_ns = [*self.namespaces, self.bridge_ns]
        for _ in range(50):
            alive = [p for ns in all_ns for p in netns_pids(ns)]
            for pid in alive:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            for proc in [*self._holders, *(p for _, p in self.procs)]:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.1)
            if not alive:
                break
            time.sleep(0.1)
        for proc in self._holders:
            for stream in (proc.stdout, proc.stderr):
                if stream:
                    stream.close()
        for ns in all_ns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        left = set(leftover_namespaces(self.prefix))
        if left:
            raise RuntimeError(f"namespaces left behind: {sorted(left)}")
        # The first `ip netns add` on a machine bind-mounts NETNS_DIR onto itself, and
        # `ip netns del` leaves that mount: undo it once no namespace is left in it. On a busy
        # machine the kernel may still hold the mount for a moment after the last `ip netns
        # del` (umount says busy): retried until a deadline, then an error saying so.
        if self._mounted_netns_dir:
            self._unmount_netns_dir()

    def _unmount_netns_dir(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while netns_dir_mounted():
            if os.listdir(NETNS_DIR):  # another user's namespaces: theirs to clean up
                return
            out = subprocess.run(["umount", NETNS_DIR], capture_output=True, text=True,
                                 timeout=30)
            if out.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"could not unmount {NETNS_DIR} within {timeout:g}s: "
                                   f"{out.stderr.strip()}")
            time.sleep(0.1)
        self._mounted_netns_dir = False

    def __enter__(self) -> Hosts:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def leftover_namespaces(prefix: str) -> list[str]:
    """Network namespaces whose name starts with ``prefix``."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    return [line.split()[0] for line in out.stdout.splitlines()
            if line.split() and line.split()[0].startswith(prefix)]


@contextlib.contextmanager
def hosts(n: int, shared: Path) -> Iterator[Hosts]:
    """``n`` namespace hosts around ``shared`` for the duration of the block."""
    with Hosts(n, shared) as h:
        yield h
