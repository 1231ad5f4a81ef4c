"""The embedded cluster leaves no ``/dev/shm/sem.mp-*`` files, even when its learner is killed
with its whole process group (``SIGKILL``, the multiprocessing resource tracker included).

Each nanny start makes two spawn-context queues, six named semaphores; before
:class:`daskrl.deploy._nanny.EmbeddedNanny` their files stayed in ``/dev/shm`` for good when the
learner and its tracker were killed together. Files are told apart by the processes that map
them (``/proc/<pid>/maps``), not by a listing of ``/dev/shm``: other programs make some too.
(The nanny preload refusing a worker, without a cluster: tests/unit/test_shm_files.py.)
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
from cli_cluster import (
    Processes,
    linked_semaphores,
    mapped_semaphores,
    process_group_alive,
    scheduler_address,
    scheduler_args,
    wait_for_file,
    wait_for_first_commit,
    wait_until_unnamed,
    worker_args,
)
from distributed import Client

from daskrl.deploy import local_cluster

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")]

ROOT = Path(__file__).resolve().parents[1]


def test_started_workers_queues_hold_no_semaphore_names_and_still_work():
    before = linked_semaphores(os.getpid())
    with local_cluster(2, tls=False) as cluster, Client(cluster, set_as_default=False) as client:
        client.wait_for_workers(2)
        assert mapped_semaphores(os.getpid()) >= 12  # the nannies' queues: in use, unnamed
        assert linked_semaphores(os.getpid()) - before == set()
        pids = client.run(os.getpid)
        for pid in pids.values():
            assert linked_semaphores(pid) == set()
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
        # The nanny unlinks its new queues' names once it hears its new process started, which
        # may be after the worker joined (wait_until_unnamed's window): a deadline, not a sleep.
        deadline = time.monotonic() + 30
        while named := linked_semaphores(os.getpid()) - before:
            assert time.monotonic() < deadline, f"still named 30 s after the restart: {named}"
            time.sleep(0.1)
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
            named |= linked_semaphores(pid)
        assert mapped_semaphores(child.pid) >= 12  # the nannies' queues are there
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
        # The killed learner's weights segment: the next learner's sweep would remove it
        # (daskrl/weights/_segments.py); the test does not leave it for one.
        for f in Path("/dev/shm").glob(f"daskrl-weights-{child.pid}-*"):
            f.unlink(missing_ok=True)
        log.close()


def _workers(client: Client) -> dict[int, int]:
    """Nanny pid -> its worker process's pid, for every worker (a CLI nanny is its parent)."""
    got = client.run(lambda: (os.getpid(), os.getppid()), on_error="ignore")  # not the killed
    return {ppid: pid for pid, ppid in got.values()}


def test_dask_workers_killed_whole_leave_semaphore_files_unless_the_nanny_preload_ran(tmp_path):
    """``dask worker --preload-nanny daskrl.deploy.nanny_preload`` (how the SLURM recipes start
    their workers): once its worker process is up, and again after the nanny restarts it, the
    queues they share hold no names, so a SIGKILL to the whole job (nanny, worker, resource
    tracker: a batch system's end of a job) leaves no file. The same kill of a worker started
    without it leaves its six. (The worker process opens them by name; the nanny's mappings
    show glibc's temporary names, so the worker's are the ones to read.)"""
    procs = Processes(tmp_path)
    sched = tmp_path / "scheduler.json"
    left: set[str] = set()
    try:
        procs.start("scheduler", scheduler_args(sched))
        wait_for_file(sched, procs)
        plain = procs.start("plain", worker_args(sched, "plain"))
        preloaded = procs.start("preloaded", [*worker_args(sched, "preloaded"), "--preload-nanny",
                                              "daskrl.deploy.nanny_preload"])
        with Client(scheduler_address(sched), set_as_default=False) as client:
            client.wait_for_workers(2, timeout=120)
            workers = _workers(client)
            assert set(workers) == {plain.pid, preloaded.pid}, (workers, procs.logs())
            left = linked_semaphores(workers[plain.pid])
            assert len(left) == 6, left  # without the preload: named, a kill leaves them
            first = workers[preloaded.pid]
            assert mapped_semaphores(first) >= 6  # with it: in use ...
            wait_until_unnamed(first)  # ... and unnamed
            os.kill(first, signal.SIGKILL)  # its nanny starts a new worker process
            deadline = time.monotonic() + 120
            while _workers(client).get(preloaded.pid) in (None, first):
                assert time.monotonic() < deadline, "the nanny did not restart its worker"
                time.sleep(0.2)
            second = _workers(client)[preloaded.pid]
            assert mapped_semaphores(second) >= 6
            wait_until_unnamed(second)  # the new queues too
            assert client.submit(sum, [1, 2], workers=["preloaded"]).result() == 3
            for proc in (plain, preloaded):
                os.killpg(proc.pid, signal.SIGKILL)  # the job, tracker included, at once
                proc.wait(timeout=60)
            deadline = time.monotonic() + 60
            while any(process_group_alive(p.pid) for p in (plain, preloaded)):
                assert time.monotonic() < deadline, "the killed workers' processes are still alive"
                time.sleep(0.1)
        assert sorted(f for f in left if os.path.exists(f)) == sorted(left)  # the plain ones
    finally:
        procs.kill_all()
        for f in left:  # never leave them, pass or fail
            Path(f).unlink(missing_ok=True)
