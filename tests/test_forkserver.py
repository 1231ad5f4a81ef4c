"""The embedded cluster's workers fork from a forkserver that imported their side once
(:mod:`daskrl.deploy._forkserver`): they get the environment spawned workers got (one torch
thread, the nanny's pre-spawn variables), stay independent processes (a killed worker is
restarted from the forkserver, the other one carries on), CUDA is never initialised in the
forkserver, and nothing is left once the cluster closes or its learner is SIGKILLed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from cli_cluster import process_group_alive, wait_for_first_commit
from distributed import Client

from daskrl.deploy import _forkserver, local_cluster

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif("forkserver" not in __import__("multiprocessing")
                                 .get_all_start_methods(), reason="no forkserver here")]

ROOT = Path(__file__).resolve().parents[1]


def _worker_state() -> dict:
    import os
    import sys

    import psutil
    import torch

    return {"pid": os.getpid(), "ppid": psutil.Process().ppid(),
            "torch_threads": torch.get_num_threads(),
            "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                   "OPENBLAS_NUM_THREADS", "PYTHONHASHSEED",
                                                   "MALLOC_TRIM_THRESHOLD_")},
            "torch_imported_before_task": "torch" in sys.modules,
            "cuda_initialized": torch.cuda.is_initialized()}


def _forkservers() -> list[psutil.Process]:
    """This process's forkserver children (there should be none once a cluster closed)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "multiprocessing.forkserver" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            continue
    return out


def _maps_cuda(pid: int) -> bool:
    return "libcuda.so" in Path(f"/proc/{pid}/maps").read_text()


def _states(client: Client) -> dict[str, dict]:
    return client.run(_worker_state)


CLUSTER_STATES = """
import json, os, sys
import dask, psutil
from distributed import Client
sys.path.insert(0, {tests!r})
from test_forkserver import _forkservers, _maps_cuda, _worker_state
from daskrl.deploy import _forkserver, local_cluster
if __name__ == "__main__":
    with dask.config.set({{"daskrl.embedded-cluster.forkserver": sys.argv[1] == "forkserver"}}), \\
            local_cluster(2, tls=False) as cluster, Client(cluster, set_as_default=False) as c:
        server = _forkserver.running()
        first = c.run(_worker_state)
        c.restart()  # every worker restarted (forked again from the same forkserver)
        again = c.run(_worker_state)
        cuda = server is not None and _maps_cuda(server)
    print(json.dumps({{"learner": os.getpid(), "server": server, "cuda_in_server": cuda,
                      "first": list(first.values()), "again": list(again.values()),
                      "left": [p.pid for p in _forkservers()]}}))
"""


def _cluster_states(method: str) -> dict:
    """Worker states of an embedded cluster started in a fresh learner process whose
    environment has none of the nanny's pre-spawn variables yet."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                        "MALLOC_TRIM_THRESHOLD_", "PYTHONHASHSEED")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    code = CLUSTER_STATES.format(tests=str(ROOT / "tests"))
    out = subprocess.run([sys.executable, "-c", code, method], capture_output=True, text=True,
                         timeout=240, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_workers_fork_from_the_forkserver_with_the_spawned_workers_environment():
    spawned = _cluster_states("spawn")
    assert spawned["server"] is None
    assert {s["ppid"] for s in spawned["first"]} == {spawned["learner"]}  # spawned by it

    forked = _cluster_states("forkserver")
    server = forked["server"]
    assert server is not None and not forked["cuda_in_server"]
    for states in (forked["first"], forked["again"]):
        assert {s["ppid"] for s in states} == {server}  # forked, restarts included
        # the environment spawned workers get: the nanny's pre-spawn variables, and torch
        # (imported in the forkserver) with one thread
        assert [s["env"] for s in states] == [s["env"] for s in spawned["first"]]
        assert states[0]["env"]["OMP_NUM_THREADS"] == "1"
        assert {s["torch_threads"] for s in states} == {1}
        assert all(s["torch_imported_before_task"] for s in states)
        assert not any(s["cuda_initialized"] for s in states)
    assert not {s["pid"] for s in forked["again"]} & {s["pid"] for s in forked["first"]}
    assert forked["left"] == []  # closed: the forkserver is stopped too
    assert not psutil.pid_exists(server) or psutil.Process(server).status() == "zombie"


def test_a_killed_worker_is_restarted_from_the_forkserver_and_the_other_carries_on():
    with local_cluster(2, tls=False) as cluster, Client(cluster, set_as_default=False) as c:
        c.wait_for_workers(2)
        states = _states(c)
        server = _forkserver.running()
        victim, other = list(states)
        os.kill(states[victim]["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 180
        while True:
            now = set(c.scheduler_info()["workers"])
            if len(now) == 2 and victim not in now:
                break
            assert time.monotonic() < deadline, "the nanny did not restart its worker"
            time.sleep(0.2)
        after = _states(c)
        assert after[other]["pid"] == states[other]["pid"]  # untouched by the crash
        assert {s["ppid"] for s in after.values()} == {server}
        assert c.submit(sum, [1, 2], workers=[other]).result() == 3
    assert _forkservers() == []


def test_the_learner_imports_nothing_more_for_the_forkserver():
    # distributed's own forkserver set-up imports numpy, pandas, lz4 in the calling process
    code = textwrap.dedent("""
        import json, sys
        from distributed import Client
        from daskrl.deploy import _forkserver, local_cluster
        if __name__ == "__main__":
            with local_cluster(1, tls=False) as cluster, Client(cluster) as c:
                ok = _forkserver.running() is not None
                print(json.dumps([ok, "pandas" in sys.modules, "torch" in sys.modules]))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=240, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == [True, False, False]


def test_a_sigkilled_learner_leaves_no_forkserver_and_no_worker(tmp_path):
    store = tmp_path / "store"
    log = (tmp_path / "collect.log").open("w")
    child = subprocess.Popen(
        [sys.executable, "-m", "daskrl.cli", "collect", "--env", "CartPole-v1", "--store",
         str(store), "--frames", "none", "--frames-per-batch", "256", "--workers", "2",
         "--no-progress"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)})
    try:
        wait_for_first_commit(store, child, tmp_path / "collect.log")
        tree = psutil.Process(child.pid).children(recursive=True)
        servers = [p for p in tree if "multiprocessing.forkserver" in " ".join(p.cmdline())
                   and p.ppid() == child.pid]
        assert len(servers) == 1, [p.cmdline() for p in tree]
        assert len([p for p in tree if p.ppid() == servers[0].pid]) == 2  # the workers
        child.send_signal(signal.SIGKILL)  # the learner alone, not its process group
        child.wait(timeout=60)
        deadline = time.monotonic() + 120
        while process_group_alive(child.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert process_group_alive(child.pid) == []  # forkserver, workers, tracker: all gone
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=60)
        for p in process_group_alive(child.pid):
            p.kill()
        log.close()
