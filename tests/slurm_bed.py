"""A real one-node SLURM, started by the tests from Debian's packages and torn down after.

``slurmctld``, ``slurmd`` and a ``munged`` of its own (own key, own socket), all configured in
one temporary directory: ``slurm.conf`` is passed with ``SLURM_CONF``, nothing is written to
``/etc`` or ``/var``.  The node is this machine on loopback (``NodeAddr=127.0.0.1``), with
``OverSubscribe=FORCE:4`` so that several one-CPU jobs fit on a 2-core machine, memory checked
against the node's but not booked (``CR_Core``: a small CI machine fits the jobs), no accounting
(job state comes from ``scontrol``, which keeps finished jobs for ``MinJobAge`` seconds), and
``proctrack/linuxproc`` + ``task/none`` (no cgroups needed).  Needs root (CI is root), and
Debian's ``slurmctld slurmd slurm-client munge``, which the bed installs itself where they are
missing (:mod:`beds.packages`).

:func:`slurm_bed` cancels every job at the end, stops the daemons, kills whatever a job left
running, checks that no process of the bed survives and removes the directory.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from beds.packages import SEARCH_PATH, ensure_commands

PARTITION = "debug"
COMMANDS = {"munged": "munge", "munge": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd",
            **dict.fromkeys(("sbatch", "scontrol", "squeue", "scancel", "sinfo", "srun"),
                            "slurm-client")}
"""The commands the bed runs, each with the Debian package that has it."""
ENDED_STATES = {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
                "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT"}


@dataclass
class SlurmBed:
    """A running one-node SLURM: run its commands with :meth:`run` (or with :attr:`env`)."""

    directory: Path
    conf: Path
    node: str
    cpus: int
    memory_mb: int
    """The node's ``RealMemory`` (below what ``slurmd -C`` reports)."""
    start_seconds: float
    """How long the daemons took to start until the node was idle."""
    partition: str = PARTITION
    daemons: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """Environment variables that point SLURM's commands at this bed."""
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *args: str, check: bool = True, timeout: float = 30, cwd: Path | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run a SLURM command (``sbatch``, ``scontrol``, ...) against this bed."""
        out = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout,
                             cwd=cwd, env={**os.environ, **(env or {}), **self.env})
        if check and out.returncode:
            raise RuntimeError(f"{' '.join(args)} exited with {out.returncode}:\n"
                               f"{out.stdout}{out.stderr}")
        return out

    def jobs(self) -> dict[str, dict[str, str]]:
        """Every job slurmctld knows (running, pending, or ended less than MinJobAge ago),
        as ``scontrol show job`` fields."""
        out = self.run("scontrol", "show", "job", "--oneliner").stdout
        jobs = {}
        for line in out.splitlines():
            fields = dict(re.findall(r"(\S+?)=(\S*)", line))
            if "JobId" in fields:
                jobs[fields["JobId"]] = fields
        return jobs

    def wait_until_all_ended(self, timeout: float = 60) -> dict[str, dict[str, str]]:
        """Wait until every job has ended; returns :meth:`jobs`."""
        deadline = time.monotonic() + timeout
        while True:
            jobs = self.jobs()
            if all(j["JobState"] in ENDED_STATES for j in jobs.values()):
                return jobs
            if time.monotonic() > deadline:
                raise TimeoutError(f"jobs still running after {timeout}s: "
                                   f"{ {k: j['JobState'] for k, j in jobs.items()} }")
            time.sleep(0.5)

    def cancel_all(self, timeout: float = 60) -> None:
        """Cancel every job and wait until SLURM has ended them."""
        self.run("scancel", "--partition", self.partition, check=False)
        self.wait_until_all_ended(timeout)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted((self.directory / "log").glob("*")))


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _node_hardware() -> tuple[int, int]:
    """CPUs and memory (MiB) as ``slurmd -C`` sees this machine."""
    out = subprocess.run([command("slurmd"), "-C"], capture_output=True, text=True, timeout=30,
                         check=True).stdout
    cpus = int(re.search(r"\bCPUs=(\d+)", out).group(1))
    memory = int(re.search(r"\bRealMemory=(\d+)", out).group(1))
    return cpus, memory


def _slurm_conf(d: Path, node: str, cpus: int, memory_mb: int, ports: list[int]) -> str:
    return f"""\
ClusterName=daskrl-test
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge/run/munge.socket
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=600
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN
PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


def _start(args: list[str], log: Path, **kwargs: object) -> subprocess.Popen:
    with open(log, "wb") as f:
        return subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, **kwargs)


def _stop(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(timeout=15)
            return
        except subprocess.TimeoutExpired:
            continue


def bed_processes(bed_dir: Path) -> dict[int, str]:
    """Processes (pid: command line) that belong to the bed in ``bed_dir``: its daemons and
    ``slurmstepd`` (their command line or environment names the bed's files) and the jobs'
    processes (started with ``SLURM_CONF`` pointing into the bed)."""
    marker = str(bed_dir).encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or a kernel thread
            continue
        if marker in cmdline or marker in environ:
            found[int(entry.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    return found


def _kill_leftovers(bed_dir: Path, timeout: float = 15) -> dict[int, str]:
    """SIGKILL what is left of the bed; returns what still lives after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        left = bed_processes(bed_dir)
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _start_munge(d: Path) -> subprocess.Popen:
    """``munged`` as the ``munge`` user, with its own key, socket, log and seed files."""
    munge = pwd.getpwnam("munge")
    for sub, mode in (("munge", 0o755), ("munge/etc", 0o700), ("munge/run", 0o755),
                      ("munge/lib", 0o700), ("munge/log", 0o700)):
        (d / sub).mkdir(mode=mode)
        os.chown(d / sub, munge.pw_uid, munge.pw_gid)
    key = d / "munge/etc/munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    os.chown(key, munge.pw_uid, munge.pw_gid)
    return _start([command("munged"), "--foreground", f"--key-file={key}",
                   f"--socket={d}/munge/run/munge.socket",
                   f"--pid-file={d}/munge/run/munged.pid",
                   f"--log-file={d}/munge/log/munged.log",
                   f"--seed-file={d}/munge/lib/munged.seed"],
                  d / "log" / "munged.out", user=munge.pw_uid, group=munge.pw_gid,
                  extra_groups=[])


def _wait(what: str, ready: object, bed: SlurmBed, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():  # type: ignore[operator]
        for name, proc in bed.daemons.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode} while waiting for "
                                   f"{what}\n{bed.logs()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout}s\n{bed.logs()}")
        time.sleep(0.1)


def command(name: str) -> str:
    """The full path of a SLURM or munge command (the daemons live in /usr/sbin, which a
    non-login root shell may not have on PATH)."""
    return shutil.which(name, path=SEARCH_PATH) or name


@contextlib.contextmanager
def slurm_bed(parent: str | None = None, start_timeout: float = 60) -> Iterator[SlurmBed]:
    """Start a one-node SLURM in a fresh directory under ``parent``; stop it on exit."""
    if os.geteuid() != 0:
        raise PermissionError("the SLURM test bed runs its daemons as root")
    ensure_commands("SLURM", COMMANDS)  # installs Debian's packages where it can
    d = Path(tempfile.mkdtemp(prefix="daskrl-slurm-", dir=parent))
    d.chmod(0o755)  # munged checks that every directory above its socket is accessible
    for sub in ("state", "spool", "run", "log"):
        (d / sub).mkdir()
    began = time.monotonic()
    cpus, memory = _node_hardware()
    node = socket.gethostname().split(".")[0]
    conf = d / "slurm.conf"
    conf.write_text(_slurm_conf(d, node, cpus, memory * 3 // 4, _free_ports(2)))
    bed = SlurmBed(d, conf, node, cpus, memory * 3 // 4, start_seconds=0.0)
    env = {**os.environ, **bed.env}
    try:
        bed.daemons["munged"] = _start_munge(d)
        _wait("munged's socket", (d / "munge/run/munge.socket").exists, bed, start_timeout)
        bed.daemons["slurmctld"] = _start([command("slurmctld"), "-D", "-f", str(conf)],
                                          d / "log" / "slurmctld.out", env=env)
        bed.daemons["slurmd"] = _start([command("slurmd"), "-D", "-f", str(conf), "-N", node],
                                       d / "log" / "slurmd.out", env=env)

        def idle() -> bool:
            out = bed.run("sinfo", "--noheader", "--Node", "--format=%T", check=False)
            return out.returncode == 0 and out.stdout.strip() == "idle"

        _wait("an idle SLURM node", idle, bed, start_timeout)
        bed.start_seconds = time.monotonic() - began
        yield bed
    finally:
        try:
            if bed.daemons.get("slurmd") and bed.daemons["slurmd"].poll() is None:
                bed.cancel_all()
        finally:
            for name in ("slurmd", "slurmctld", "munged"):
                if name in bed.daemons:
                    _stop(bed.daemons[name])
            left = _kill_leftovers(d)
            shutil.rmtree(d, ignore_errors=True)
        if left:
            raise RuntimeError(f"the SLURM bed left processes that SIGKILL did not end: {left}")
