"""A Dask cluster on namespace hosts, started with the ``dask`` CLI, and a learner process.

Host 0 runs the scheduler (and the learner, :mod:`hosts_learner`); hosts 1.. run
``workers_per_host`` one-thread ``dask worker`` processes each. The scheduler file and
everything the tests read back live in the shared directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .hosts import Hosts

ROOT = Path(__file__).resolve().parents[2]
LEARNER = Path(__file__).with_name("hosts_learner.py")
WORKER_ENV = {
    "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
    "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "500ms",
}


def host_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every process on the hosts: this checkout's daskrl, no temp dir
    of the root namespace."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TMPDIR", "PYTEST_CURRENT_TEST", "PWD", "OLDPWD")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return {**env, **WORKER_ENV, **(extra or {})}


def tls_args(tls: dict[str, Path] | None) -> list[str]:
    if not tls:
        return []
    return ["--tls-ca-file", str(tls["ca"]), "--tls-cert", str(tls["cert"]),
            "--tls-key", str(tls["key"])]


class DaskHosts:
    """A scheduler on host 0, workers on the other hosts; logs in ``shared/logs``."""

    def __init__(self, hosts: Hosts, workers_per_host: int = 1,
                 tls: dict[str, Path] | None = None, env: dict[str, str] | None = None,
                 worker_hosts: list[int] | None = None, scheduler_port: int = 8786) -> None:
        self.hosts = hosts
        self.shared = hosts.shared
        self.logs = self.shared / "logs"
        self.logs.mkdir(exist_ok=True)
        self.tls = tls
        self.env = host_env(env)
        self.workers_per_host = workers_per_host
        self.worker_hosts = list(range(1, hosts.n)) if worker_hosts is None else worker_hosts
        protocol = "tls" if tls else "tcp"
        self.address = f"{protocol}://{hosts.address(0)}:{scheduler_port}"
        self.scheduler_file = self.shared / "scheduler.json"
        self._port = scheduler_port
        self._started = 0

    def start(self) -> DaskHosts:
        args = [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host",
                self.hosts.address(0), "--port", str(self._port), "--no-dashboard",
                "--scheduler-file", str(self.scheduler_file)]
        if self.tls:
            args += ["--protocol", "tls", *tls_args(self.tls)]
        self.hosts.run(0, args, env=self.env, log=self.logs / "scheduler.log")
        deadline = time.monotonic() + 60
        while not self.scheduler_file.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no scheduler within 60s\n{self.read_logs()}")
            time.sleep(0.1)
        for host in self.worker_hosts:
            for _ in range(self.workers_per_host):
                self.start_worker(host)
        return self

    def start_worker(self, host: int, name: str | None = None) -> str:
        """Start one more ``dask worker`` on ``host``; its name."""
        name = name or f"h{host}-w{self._started}"
        self._started += 1
        args = [sys.executable, "-m", "distributed.cli.dask_worker", self.address,
                "--nthreads", "1", "--host", self.hosts.address(host), "--no-dashboard",
                "--name", name, *tls_args(self.tls)]
        self.hosts.run(host, args, env=self.env, log=self.logs / f"{name}.log")
        return name

    def wait_for_workers(self, n: int, timeout: float = 120) -> None:
        """Until the scheduler lists ``n`` workers (asked from host 0)."""
        code = ("import sys; from distributed import Client; "
                f"c = Client({self.address!r}, timeout=60, security=SEC); "
                f"c.wait_for_workers({n}, timeout={timeout}); c.close()")
        sec = "None"
        if self.tls:
            sec = (f"__import__('daskrl.deploy').deploy.tls_security({str(self.tls['ca'])!r}, "
                   f"{str(self.tls['cert'])!r}, {str(self.tls['key'])!r})")
        out = self.hosts.check(0, [sys.executable, "-c", code.replace("SEC", sec)],
                               timeout=timeout + 60)
        if out.returncode:
            raise RuntimeError(f"{n} workers did not join: {out.stderr}\n{self.read_logs()}")

    def learner(self, name: str, config: dict[str, Any]) -> Learner:
        """Start the learner script on host 0 with ``config`` (address and tls filled in)."""
        ctl = self.shared / name
        ctl.mkdir()
        config = {"address": self.address, **config}
        if self.tls:
            config["tls"] = {k: str(v) for k, v in self.tls.items()}
        (ctl / "config.json").write_text(json.dumps(config))
        proc = self.hosts.run(0, [sys.executable, str(LEARNER), str(ctl / "config.json")],
                              env=self.env, log=ctl / "learner.log")
        return Learner(ctl, proc, self)

    def read_logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
                         for p in sorted(self.logs.glob("*.log")))


class Learner:
    """The learner process: wait for its pauses and its result."""

    def __init__(self, ctl: Path, proc: Any, cluster: DaskHosts) -> None:
        self.ctl, self.proc, self.cluster = ctl, proc, cluster

    def wait_paused(self, i: int, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not (self.ctl / f"paused-{i}").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the learner did not pause after batch {i}\n{self.log()}")
            time.sleep(0.05)

    def go(self, i: int) -> None:
        (self.ctl / f"go-{i}").write_text("")

    def result(self, timeout: float) -> dict[str, Any]:
        try:
            self.proc.wait(timeout=timeout)
        except Exception as e:
            raise RuntimeError(f"the learner did not finish within {timeout}s\n{self.log()}"
                               ) from e
        path = self.ctl / "result.json"
        if not path.exists():
            raise RuntimeError(f"the learner left no result\n{self.log()}")
        return json.loads(path.read_text())

    def log(self) -> str:
        text = (self.ctl / "learner.log").read_text(errors="replace")[-6000:]
        return f"--- learner\n{text}\n{self.cluster.read_logs()}"


@contextlib.contextmanager
def dask_hosts(shared: Path, n_hosts: int = 3, **kwargs: Any) -> Iterator[DaskHosts]:
    """Namespace hosts with a CLI-started Dask cluster on them, torn down afterwards."""
    with Hosts(n_hosts, shared) as hosts:
        yield DaskHosts(hosts, **kwargs).start()
