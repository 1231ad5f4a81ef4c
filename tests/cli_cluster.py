"""Dask clusters started the way users start them: `dask scheduler` and `dask worker` commands.

Each process is the leader of its own session (a separate process tree, as on separate nodes),
listens on loopback only, and is killed with its whole tree when the fixture ends, pass or
fail. Also: a throwaway TLS certificate authority made with ``cryptography``, and what a
process's semaphores would leave in ``/dev/shm`` if it were killed now.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

DASK = [str(Path(sys.executable).with_name("dask"))]
if not Path(DASK[0]).exists():  # no console script next to this python: use the module
    DASK = [sys.executable, "-m", "dask"]

# As in daskrl.deploy.WORKER_CONFIG, and quiet logs.
WORKER_ENV = {
    "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
    "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "500ms",
    "DASK_DISTRIBUTED__WORKER__MEMORY__MONITOR_INTERVAL": "500ms",
    "DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__INTERVAL": "2s",
}


class Processes:
    """CLI-started processes, each in its own session; :meth:`kill_all` ends every tree."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None
              ) -> subprocess.Popen:
        log = open(self.logdir / f"{name}.log", "wb")  # noqa: SIM115 - closed by the process end
        full_env = {**os.environ, **WORKER_ENV, **(env or {})}
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=full_env,
                                start_new_session=True, cwd=self.logdir)
        log.close()
        self.procs[name] = proc
        return proc

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        # Children (a nanny's worker) may outlive their leader for a moment.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    def kill_all(self) -> None:
        for name in list(self.procs)[::-1]:
            self.kill(name)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.logdir.glob("*.log")))


def process_group_alive(pgid: int) -> list:
    """The live (not zombie) processes of process group ``pgid``."""
    import psutil

    alive = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return alive


def wait_for_first_commit(store: Path, child: subprocess.Popen, log: Path,
                          timeout: float = 240) -> None:
    """Wait until ``daskrl collect`` (``child``, logging to ``log``) has committed a batch to
    ``store``; fail with its log if it exits first or nothing is committed by ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (store / "commits").is_dir() or not any(
            d.is_dir() for d in (store / "commits").iterdir()):
        assert child.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "no batch committed"
        time.sleep(0.05)


def wait_for_file(path: Path, procs: Processes, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.stat().st_size > 0):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} not written within {timeout}s\n{procs.logs()}")
        for name, p in procs.procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode}\n{procs.logs()}")
        time.sleep(0.1)


def scheduler_args(scheduler_file: Path, tls: dict[str, Path] | None = None) -> list[str]:
    args = [*DASK, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
            "--scheduler-file", str(scheduler_file)]
    if tls:
        args += ["--protocol", "tls", *tls_args(tls)]
    return args


def worker_args(scheduler_file: Path, name: str, tls: dict[str, Path] | None = None
                ) -> list[str]:
    args = [*DASK, "worker", "--scheduler-file", str(scheduler_file), "--nthreads", "1",
            "--host", "127.0.0.1", "--no-dashboard", "--name", name,
            "--local-directory", str(scheduler_file.parent / f"{name}-space")]
    if tls:
        args += tls_args(tls)
    return args


def tls_args(tls: dict[str, Path]) -> list[str]:
    return ["--tls-ca-file", str(tls["ca"]), "--tls-cert", str(tls["cert"]),
            "--tls-key", str(tls["key"])]


def scheduler_address(scheduler_file: Path) -> str:
    return json.loads(scheduler_file.read_text())["address"]


@contextlib.contextmanager
def cli_cluster(tmp: Path, n_workers: int = 2, tls: dict[str, Path] | None = None,
                env: dict[str, str] | None = None) -> Iterator[tuple[Path, Processes]]:
    """A scheduler and ``n_workers`` one-thread workers; yields (scheduler file, processes)."""
    procs = Processes(tmp)
    sched = tmp / "scheduler.json"
    try:
        procs.start("scheduler", scheduler_args(sched, tls), env)
        wait_for_file(sched, procs)
        for i in range(n_workers):
            procs.start(f"worker-{i}", worker_args(sched, f"cli-worker-{i}", tls), env)
        yield sched, procs
    finally:
        procs.kill_all()


def make_tls_files(directory: Path, common_name: str = "daskrl-test") -> dict[str, Path]:
    """A fresh CA, and one key + certificate it signed for 127.0.0.1/localhost, usable by the
    scheduler, the workers and clients (server and client auth). Returns PEM file paths."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    valid = {"not_valid_before": now - datetime.timedelta(minutes=5),
             "not_valid_after": now + datetime.timedelta(days=1)}

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder().subject_name(name(f"{common_name} CA"))
        .issuer_name(name(f"{common_name} CA")).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid["not_valid_before"]).not_valid_after(valid["not_valid_after"])
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder().subject_name(name(common_name)).issuer_name(ca_cert.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(valid["not_valid_before"]).not_valid_after(valid["not_valid_after"])
        .add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                              ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    paths = {"ca": directory / "ca.pem", "cert": directory / "cert.pem",
             "key": directory / "key.pem"}
    paths["ca"].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    paths["key"].chmod(0o600)
    return paths


def linked_semaphores(pid: int) -> set[str]:
    """The ``/dev/shm/sem.*`` files process ``pid`` maps that still have a name (a kill now
    would leave them). Told by inode: a semaphore's creator maps it under glibc's temporary
    name, which is gone as soon as it is made."""
    inodes = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/dev/shm/sem."):
            inodes.add(int(parts[4]))
    out = set()
    for f in Path("/dev/shm").glob("sem.*"):
        with contextlib.suppress(FileNotFoundError):
            if f.stat().st_ino in inodes:
                out.add(str(f))
    return out


def mapped_semaphores(pid: int) -> int:
    """How many ``/dev/shm/sem.*`` mappings process ``pid`` has, named or not."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return sum("/dev/shm/sem." in line for line in maps)


def wait_until_unnamed(pid: int, timeout: float = 30) -> None:
    """Wait until worker process ``pid`` maps no named semaphore. A worker joins the scheduler
    (and answers ``client.run``) before its nanny has heard that it started, which is when the
    nanny unlinks the names: the window of a worker start."""
    deadline = time.monotonic() + timeout
    while named := linked_semaphores(pid):
        assert time.monotonic() < deadline, f"still named {timeout} s after the start: {named}"
        time.sleep(0.1)
