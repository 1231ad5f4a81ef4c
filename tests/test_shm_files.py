"""The embedded cluster leaves no ``/dev/shm/sem.mp-*`` files, even when its learner is killed
with its whole process group (``SIGKILL``, the multiprocessing resource tracker included).

Each nanny start makes two spawn-context queues, six named semaphores; before
:class:`daskrl.deploy._nanny.EmbeddedNanny` their files stayed in ``/dev/shm`` for good when the
learner and its tracker were killed together. Files are told apart by the processes that map
them (``/proc/<pid>/maps``), not by a listing of ``/dev/shm``: other programs make some too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from cli_cluster import process_group_alive, wait_for_first_commit
from distributed import Client

from daskrl.deploy import local_cluster

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")]

ROOT = Path(__file__).resolve().parents[1]


def _linked_semaphores(pid: int) -> set[str]:
    """The ``/dev/shm/sem.*`` files process ``pid`` maps that still have a name (a kill now
    would leave them)."""
    out = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/dev/shm/sem.") \
                and not parts[5].endswith("(deleted)"):
            out.add(parts[5])
    return out


def _mapped_semaphores(pid: int) -> int:
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return sum("/dev/shm/sem." in line for line in maps)


def test_started_workers_queues_hold_no_semaphore_names_and_still_work():
    before = _linked_semaphores(os.getpid())
    with local_cluster(2, tls=False) as cluster, Client(cluster, set_as_default=False) as client:
        client.wait_for_workers(2)
        assert _mapped_semaphores(os.getpid()) >= 12  # the nannies' queues: in use, unnamed
        assert _linked_semaphores(os.getpid()) - before == set()
        pids = client.run(os.getpid)
        for pid in pids.values():
            assert _linked_semaphores(pid) == set()
        victim = next(iter(pids))
        os.kill(pids[victim], signal.SIGKILL)  # its nanny starts a new process: new queues
        deadline = time.monotonic() + 180
        while True:
            now = set(client.scheduler_info()["workers"])
            if len(now) == 2 and victim not in now:  # the new process: a new address
                break
            assert time.monotonic() < deadline, "the nanny did not restart its worker"
            time.sleep(0.2)
        assert len(client.run(os.getpid)) == 2 and pids[victim] not in client.run(os.getpid).values()
        assert _linked_semaphores(os.getpid()) - before == set()
        assert client.submit(sum, [1, 2]).result() == 3
        workers = [psutil.Process(p) for p in client.run(os.getpid).values()]
    # the nannies stopped their workers through the unnamed queues: they exited, not killed
    _gone, alive = psutil.wait_procs(workers, timeout=30)
    assert not alive


def _cli_env() -> dict[str, str]:
    paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def test_learner_killed_with_its_process_group_leaves_no_semaphore_files(tmp_path):
    store = tmp_path / "store"
    log = (tmp_path / "collect.log").open("w")
    child = subprocess.Popen(
        [sys.executable, "-m", "daskrl.cli", "collect", "--env", "CartPole-v1", "--store",
         str(store), "--frames", "none", "--frames-per-batch", "256", "--envs-per-worker", "2",
         "--workers", "2", "--no-progress"],
        stdout=log, stderr=subprocess.STDOUT, env=_cli_env(), start_new_session=True)
    named: set[str] = set()
    try:
        wait_for_first_commit(store, child, tmp_path / "collect.log")
        procs = [child.pid, *(p.pid for p in psutil.Process(child.pid).children(recursive=True))]
        for pid in procs:
            named |= _linked_semaphores(pid)
        assert _mapped_semaphores(child.pid) >= 12  # the nannies' queues are there
        os.killpg(child.pid, signal.SIGKILL)  # learner, resource tracker, workers
        child.wait(timeout=60)
        deadline = time.monotonic() + 60
        while process_group_alive(child.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = sorted(f for f in named if os.path.exists(f))
        assert named == set(), f"named semaphores a kill would leave: {sorted(named)}"
        assert left == []
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(timeout=60)
        for p in process_group_alive(child.pid):
            p.kill()
        for f in named:  # never leave them, pass or fail
            Path(f).unlink(missing_ok=True)
        log.close()
