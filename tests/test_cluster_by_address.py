"""A learner on any Dask cluster: `dask scheduler` and `dask worker` started from the command
line as separate process trees (as on separate nodes), reached by address and by scheduler file.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import time

import gymnasium
import numpy as np
import pytest
import torch
from cli_cluster import cli_cluster, scheduler_address, worker_args

import daskrl
from daskrl import deploy
from daskrl.cli import main as cli_main
from daskrl.testing import EnvVarEnv, TagPolicy

COUNTING = "daskrl.testing:Counting-v0"


def _worker_names(client) -> dict[str, str]:
    return {a: str(w["name"]) for a, w in client.scheduler_info()["workers"].items()}


def _wait_for_n_workers(client, n: int, timeout: float = 60) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while len(names := _worker_names(client)) != n:
        assert time.monotonic() < deadline, f"expected {n} workers, have {names}"
        time.sleep(0.1)
    return names


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    """(scheduler file, processes): a CLI-started scheduler and two one-thread workers."""
    with cli_cluster(tmp_path_factory.mktemp("cli-cluster"), n_workers=2) as (sched, procs):
        with deploy.connect(scheduler_address(sched)) as d:
            try:
                d.client.wait_for_workers(2, timeout=120)
            except TimeoutError:
                pytest.fail(f"the CLI workers did not start:\n{procs.logs()}")
        yield sched, procs


def _check_counting_batch(batch) -> None:
    obs, nxt = batch["observation"].numpy(), batch["next_observation"].numpy()
    np.testing.assert_array_equal(nxt - obs, np.broadcast_to([0, 1], obs.shape))


def test_learner_collects_by_address_and_by_scheduler_file(cli, tmp_path):
    sched, _ = cli
    store = str(tmp_path / "shared-store")  # every process of this "cluster" sees this path
    address = scheduler_address(sched)
    with deploy.connect(address) as d:
        assert d.cluster is None  # connected, not started: closing leaves the cluster running
        names = _worker_names(d.client)
        assert sorted(names.values()) == ["cli-worker-0", "cli-worker-1"]
        with daskrl.Collector(COUNTING, TagPolicy(), store, client=d.client, envs_per_worker=2,
                              frames_per_batch=20, total_frames=80) as collector:
            handles = list(collector)
    assert {h.worker for h in handles} == set(names)  # both CLI workers collected
    with deploy.connect(scheduler_file=sched) as d:
        assert d.client.scheduler.address == address
        with daskrl.Collector(COUNTING, TagPolicy(), store, client=d.client, envs_per_worker=2,
                              frames_per_batch=20, total_frames=40, seed=1) as collector:
            handles += list(collector)
    reader = daskrl.open_store(store)
    assert (len(reader), reader.frames) == (6, 120)
    assert sorted(h.batch_id for h in reader) == sorted(h.batch_id for h in handles)
    for h in reader:
        _check_counting_batch(h.load())


def test_cli_collect_and_info_against_a_running_cluster(cli, tmp_path):
    sched, _ = cli
    store = tmp_path / "cli-store"
    out = subprocess.run(
        [sys.executable, "-m", "daskrl.cli", "collect", "--env", "CartPole-v1", "--frames", "256",
         "--frames-per-batch", "64", "--envs-per-worker", "4", "--scheduler-file", str(sched),
         "--store", str(store), "--no-progress"],
        capture_output=True, text=True, timeout=240,
    )
    assert out.returncode == 0, out.stderr
    assert "collected 256 frames in 4 batches on 2 workers" in out.stdout
    assert daskrl.open_store(str(store)).frames == 256

    out = subprocess.run(
        [sys.executable, "-m", "daskrl.cli", "info", "--scheduler", scheduler_address(sched)],
        capture_output=True, text=True, timeout=240,
    )
    assert out.returncode == 0, out.stderr
    assert f"scheduler: {scheduler_address(sched)}  (2 workers)" in out.stdout
    for name in ("cli-worker-0", "cli-worker-1"):
        assert re.search(rf"tcp://127\.0\.0\.1:\d+\s+{name}\s+1\s+cpu\s+-\s+-\n", out.stdout)
    v = re.escape(gymnasium.__version__)
    assert re.search(rf"gymnasium\s+{v}\s+{v} \(2\)\s+ok", out.stdout), out.stdout


def test_late_worker_gets_env_vars_and_a_version_mismatch_is_refused(cli, tmp_path, capsys):
    sched, procs = cli
    # A worker whose environment reports another gymnasium version (metadata on its path).
    fake = tmp_path / "fake-site" / "gymnasium-0.0.1.dist-info"
    fake.mkdir(parents=True)
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: gymnasium\nVersion: 0.0.1\n")
    path = os.pathsep.join(p for p in (str(fake.parent), os.environ.get("PYTHONPATH")) if p)
    with deploy.connect(scheduler_address(sched)) as d:
        try:
            with daskrl.Collector(EnvVarEnv, TagPolicy(), str(tmp_path / "s"), client=d.client,
                                  envs_per_worker=2, frames_per_batch=10, total_frames=None,
                                  env_vars={"DASKRL_TEST_OFFSET": "100"}) as collector:
                batch = next(iter(collector)).load()
                assert batch["observation"][0, :, 0].tolist() == [100.0, 100.0]
                before = set(_worker_names(d.client))
                procs.start("late-worker", worker_args(sched, "late-worker"),
                            env={"PYTHONPATH": path})
                late = next(iter(set(_wait_for_n_workers(d.client, 3)) - before))
                name = collector.plugin_name

                def probe(dask_worker):  # the plugin is there, and an env built here sees it
                    return (name in dask_worker.plugins, os.environ.get("DASKRL_TEST_OFFSET"),
                            EnvVarEnv().offset)

                deadline = time.monotonic() + 30
                while (seen := d.client.run(probe, workers=[late])[late]) != (True, "100", 100):
                    assert time.monotonic() < deadline, seen
                    time.sleep(0.1)

            with pytest.raises(daskrl.VersionMismatchError, match=re.escape(
                    "1 worker(s) run other package versions than the learner:\n")) as err:
                daskrl.Collector(COUNTING, TagPolicy(), str(tmp_path / "s2"), client=d.client,
                                 envs_per_worker=2, frames_per_batch=10, total_frames=20)
            lines = str(err.value).splitlines()
            assert re.fullmatch(rf"package\s+learner\s+{re.escape(late)}", lines[1])
            assert re.fullmatch(rf"gymnasium\s+{re.escape(gymnasium.__version__)}\s+0\.0\.1",
                                lines[3])
            assert len(lines) == 5  # header, rule, one differing package, then what to do

            # `daskrl info` shows the same, and exits with status 3 (a configuration error).
            assert cli_main(["info", "--scheduler", scheduler_address(sched)]) == 3
            out, err = capsys.readouterr()
            v = re.escape(gymnasium.__version__)
            assert re.search(rf"gymnasium\s+{v}\s+0\.0\.1 \(1\), {v} \(2\)\s+DIFFERS", out), out
            assert re.search(r"torch\s+\S+\s+\S+ \(3\)\s+ok", out), out
            assert "1 worker(s) with other versions, 0 with an unusable device." in err
        finally:
            procs.kill("late-worker")
            _wait_for_n_workers(d.client, 2)


#: What a collection's worker imports first. Imported there through ``importlib`` (a function
#: defined in this test module would not unpickle on a CLI worker, which cannot import it).
WORKER_SIDE = ("daskrl.store._store", "daskrl.testing", "daskrl.worker._tasks")


@pytest.mark.timeout(180)
def test_closing_with_a_frozen_scheduler_ends_within_its_deadlines(tmp_path):
    """A scheduler that stops answering (SIGSTOP: a hung node) while a batch is in flight:
    closing the collector takes at most its bounded calls (``call_timeout`` each), not forever,
    and what was committed stays."""
    import signal

    # Long enough for the start's bounded calls (plugin, store probe) on a loaded 2-core
    # machine running the suite in parallel; the close must end within two of them.
    call_timeout = 5.0
    (tmp_path / "cluster").mkdir()
    with (cli_cluster(tmp_path / "cluster", n_workers=1) as (sched, procs),
          deploy.connect(scheduler_address(sched)) as d):
        d.client.wait_for_workers(1, timeout=120)
        # The worker imports what a collection runs first: on a loaded machine those imports
        # alone can take the start's store probe past this test's short call_timeout.
        for module in WORKER_SIDE:
            d.client.run(importlib.import_module, module)
        collector = daskrl.Collector(COUNTING, TagPolicy(), str(tmp_path / "s"), client=d.client,
                                     envs_per_worker=2, frames_per_batch=20,
                                     total_frames=2_000_000, call_timeout=call_timeout,
                                     rounds=False, batches_in_flight=2)
        first = next(iter(collector))
        assert collector.in_flight >= 1  # the next batch is on its way
        os.killpg(procs.procs["scheduler"].pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            collector.close()
            took = time.monotonic() - started
        finally:
            os.killpg(procs.procs["scheduler"].pid, signal.SIGCONT)
        # unpublishing and unregistering the worker plugin are bounded by call_timeout
        assert took < 2 * call_timeout + 5, took
    assert daskrl.open_store(str(tmp_path / "s")).handle(first.batch_id).frames == 20


def test_a_worker_without_a_nanny_sizes_torch_threads_to_its_own(cli, tmp_path):
    # No nanny, so no OMP_NUM_THREADS=1: torch would start one intra-op thread per core (2
    # here) in a one-thread worker, and several such workers oversubscribe the host.
    sched, procs = cli
    bare = {var: "" for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    with deploy.connect(scheduler_address(sched)) as d:
        before = set(_worker_names(d.client))
        procs.start("bare-worker", [*worker_args(sched, "bare-worker"), "--no-nanny"], env=bare)
        try:
            [addr] = set(_wait_for_n_workers(d.client, 3)) - before

            def threads():
                return d.client.run(lambda: torch.get_num_threads(), workers=[addr])[addr]

            assert threads() > 1  # torch's default: one per core
            with daskrl.Collector(COUNTING, TagPolicy(), str(tmp_path / "s"), client=d.client,
                                  envs_per_worker=1, frames_per_batch=10, total_frames=30):
                assert threads() == 1  # the worker's --nthreads 1
                # The nanny's workers keep the nanny's one thread.
                others = d.client.run(lambda: (torch.get_num_threads(),
                                               os.environ["OMP_NUM_THREADS"]),
                                      workers=list(before))
                assert set(others.values()) == {(1, "1")}
            # A count the user gives in env_vars is torch's count, though torch started first.
            with daskrl.Collector(COUNTING, TagPolicy(), str(tmp_path / "s2"), client=d.client,
                                  envs_per_worker=1, frames_per_batch=10, total_frames=30,
                                  env_vars={"OMP_NUM_THREADS": "2"}):
                assert threads() == 2
        finally:
            # env_vars stay set on the module's workers: give them their nanny's count back.
            def one_thread():
                os.environ["OMP_NUM_THREADS"] = "1"
                torch.set_num_threads(1)

            d.client.run(one_thread, workers=list(before))
            procs.kill("bare-worker")
            _wait_for_n_workers(d.client, 2)


def test_an_in_process_worker_leaves_the_learners_torch_threads_alone(inproc_client, tmp_path):
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # more than the workers' one thread each
    try:
        with daskrl.Collector(COUNTING, TagPolicy(), str(tmp_path / "s"), client=inproc_client,
                              envs_per_worker=1, frames_per_batch=10, total_frames=30) as c:
            assert len(list(c)) == 3
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
