"""The fault suite: each fault injected for real on a multi-process LocalCluster."""

from __future__ import annotations

import asyncio
import functools
import os
import re
import signal
import threading
import time

import pytest
from counting_stores import check_counting_store
from distributed import Client
from scheduler_kills import KillAfterCommit

import daskrl
from daskrl import BatchTimeoutError, EnvError
from daskrl.deploy import local_cluster
from daskrl.errors import ClusterError
from daskrl.testing import FaultyEnv, SlowEnv, TagPolicy, check_episode_continuity

pytestmark = pytest.mark.faults


CLIENTS = ["sync-client", "async-client"]
"""Worker-loss tests run with both kinds of client: both get the same supervision."""


def _collect(kind, cluster, client, env, policy, url, on_handle, stop=None, **options):
    """Iterate a collector on ``cluster`` with a synchronous ``client`` or an asynchronous one
    of its own; after each handle call ``on_handle(collector, handles)`` (sync; awaiting the
    weights version it may return); stop when ``stop(handles)``. Return the handles."""
    handles = []
    if kind == "sync-client":
        with daskrl.Collector(env, policy, url, client=client, **options) as collector:
            for handle in collector:
                handles.append(handle)
                on_handle(collector, handles)
                if stop is not None and stop(handles):
                    break
        return handles

    async def main():
        async with (Client(cluster.scheduler_address, security=cluster.security,
                           asynchronous=True) as aclient,
                    daskrl.Collector(env, policy, url, client=aclient, **options) as collector):
            async for handle in collector:
                handles.append(handle)
                # In a thread: the (synchronous) fault injection must not block this loop.
                version = await asyncio.to_thread(on_handle, collector, handles)
                if version is not None:
                    await version
                if stop is not None and stop(handles):
                    break
    asyncio.run(main())
    return handles


@pytest.fixture
def own_cluster():
    """A cluster of its own: these tests kill its workers."""
    with local_cluster(2) as cluster, Client(cluster, set_as_default=False) as client:
        yield cluster, client


@pytest.mark.parametrize("kind", CLIENTS)
@pytest.mark.parametrize("how", ["sigkill", "nanny-restart"])
def test_worker_lost_mid_batch_costs_a_retry_only(own_cluster, tmp_path, how, kind):
    cluster, client = own_cluster
    url = str(tmp_path / "s")
    env = functools.partial(SlowEnv, 0.002)

    def kill(collector, handles):
        if len(handles) == 4:
            victim = handles[-1].worker
            if how == "sigkill":
                pid = client.run(os.getpid, workers=[victim])[victim]
                os.kill(pid, signal.SIGKILL)
            else:
                client.restart_workers([victim])

    handles = _collect(kind, cluster, client, env, TagPolicy(), url, kill, envs_per_worker=2,
                       frames_per_batch=80, total_frames=80 * 24)
    assert sorted(h.batch_id for h in handles) == list(range(24))
    assert sum(h.frames for h in handles) == 80 * 24
    check_counting_store(url, 24, 80 * 24)


@pytest.mark.parametrize("rounds", [True, False])
def test_worker_lost_holding_a_committed_batch_leaves_episodes_continuous(tmp_path, rounds):
    # One stream on two workers. The stream's worker dies right after committing batch 1,
    # before its handle leaves: the stream starts again on the other worker (with envs of its
    # own) and is sent batch 1 again, whose write finds the commit and hands back the
    # original. The stream's next batches must not continue the episodes of that discarded
    # re-run; nothing is committed or handed over twice.
    flag = tmp_path / "killed"
    with local_cluster(2) as cluster, Client(cluster, set_as_default=False) as client:
        client.register_plugin(KillAfterCommit(1, str(flag)), name="kill-after-commit")
        url = str(tmp_path / "s")
        env = functools.partial(SlowEnv, 0.001, 7)
        with daskrl.Collector(env, TagPolicy(), url, client=client, envs_per_worker=2,
                              frames_per_batch=20, total_frames=100, num_workers=1,
                              rounds=rounds) as c:
            handles = list(c)
        killed = flag.read_text()
        assert sorted(h.batch_id for h in handles) == [0, 1, 2, 3, 4]
        by_id = {h.batch_id: h for h in handles}
        assert by_id[1].worker == killed  # the original attempt was kept
        assert {by_id[b].worker for b in (2, 3, 4)} != {killed}
    check_counting_store(url, 5, 100)


@pytest.mark.parametrize("kind", CLIENTS)
def test_weights_lost_with_their_worker_are_scattered_again(own_cluster, tmp_path, kind):
    cluster, client = own_cluster
    policy = TagPolicy()
    newest = []

    def update_then_kill(collector, handles):
        if len(handles) == 1:
            return collector.update_weights(policy)
        if len(handles) == 2:  # version 1 is published: kill every worker holding it
            newest.append(collector.weights_version)
            [name] = [n for n in client.list_datasets() if n.endswith(f"-weights-v{newest[0]}")]
            key = client.get_dataset(name).key
            # Dask cannot recompute scattered data.
            for worker, held in client.run(lambda dask_worker: key in dask_worker.data).items():
                if held:
                    os.kill(client.run(os.getpid, workers=[worker])[worker], signal.SIGKILL)
        return None

    got = _collect(kind, cluster, client, "daskrl.testing:Counting-v0", policy,
                   str(tmp_path / "s"), update_then_kill, lambda h: len(h) == 8,
                   envs_per_worker=2, frames_per_batch=10, total_frames=None, rounds=True,
                   shared_memory=False)
    assert newest == [1]
    assert {h.weights_version for h in got[-2:]} == {1}
    check_episode_continuity(daskrl.open_store(str(tmp_path / "s")))


@pytest.mark.parametrize("kind", CLIENTS)
def test_losing_every_worker_is_an_error_after_a_bounded_wait(tmp_path, kind):
    with local_cluster(1) as cluster, Client(cluster, set_as_default=False) as client:
        def scale_to_zero(collector, handles):
            if len(handles) == 1:
                cluster.scale(0)

        with pytest.raises(ClusterError, match="the cluster has had no workers for 3s"):
            _collect(kind, cluster, client, functools.partial(SlowEnv, 0.01), TagPolicy(),
                     str(tmp_path / "s"), scale_to_zero, lambda h: len(h) > 100,
                     envs_per_worker=1, frames_per_batch=50, total_frames=None,
                     lost_workers_timeout=3)
    # what was committed before the workers left is whole and continuous
    check_episode_continuity(daskrl.open_store(str(tmp_path / "s")))


@pytest.mark.parametrize(("fault", "message"), [
    ("raise", "raised in step() at step"),
    ("reset", "raised in reset() at step"),
    ("nan", "returned a non-finite observation at step"),
    ("shape", "an observation of shape (3,) and dtype float32"),
    ("dtype", "an observation of shape (2,) and dtype <U1"),
])
def test_misbehaving_env_is_named_with_worker_step_and_version(client, tmp_path, fault, message):
    env = functools.partial(FaultyEnv, fault, 7, token=str(tmp_path))
    with (
        daskrl.Collector(env, TagPolicy(), str(tmp_path / "s"), client=client,
                         envs_per_worker=2, frames_per_batch=20, total_frames=None) as c,
        pytest.raises(EnvError) as info,
    ):
        for _ in c:
            pass
    text = str(info.value)
    assert message in text, text
    assert "env factory daskrl.testing.FaultyEnv (env index" in text
    assert re.search(r"\[worker tcp://127\.0\.0\.1:\d+, weights version 0\]", text)
    if fault in ("raise", "reset"):
        assert "the env's traceback, on the worker" in text and "injected" in text
    assert daskrl.open_store(str(tmp_path / "s")).frames % 20 == 0  # only whole batches


def test_restart_on_env_error_carries_on_and_counts(client, tmp_path):
    env = functools.partial(FaultyEnv, "raise", 15, True, token=str(tmp_path))
    with daskrl.Collector(env, TagPolicy(), str(tmp_path / "s"), client=client,
                          envs_per_worker=2, frames_per_batch=20, total_frames=200,
                          on_env_error="restart") as c:
        handles = list(c)
    assert sum(h.frames for h in handles) == 200
    assert sum(h.env_restarts for h in handles) >= 1
    check_counting_store(str(tmp_path / "s"), 10, 200)


def test_batch_deadline_stops_a_slow_env(client, tmp_path):
    env = functools.partial(FaultyEnv, "hang", 3, False, 0.5, token=str(tmp_path))
    with (
        daskrl.Collector(env, TagPolicy(), str(tmp_path / "s"), client=client,
                         envs_per_worker=1, frames_per_batch=50, total_frames=None,
                         batch_timeout=1.0) as c,
        pytest.raises(BatchTimeoutError, match="ran past its deadline of 1s at step"),
    ):
        next(iter(c))
    assert len(daskrl.open_store(str(tmp_path / "s"))) == 0


def test_vector_env_factory_is_collected_not_refused(client, tmp_path):
    """Vector envs are an env kind of their own (tests/test_vector_envs.py)."""
    import gymnasium as gym

    factory = functools.partial(gym.make_vec, "CartPole-v1", 2, vectorization_mode="sync")
    with daskrl.Collector(factory, TagPolicy(), str(tmp_path / "s"), client=client,
                          frames_per_batch=8, total_frames=16, num_workers=1) as c:
        assert c.config.envs_per_worker == 2
        assert sum(h.frames for h in c) == 16


def test_ctrl_c_during_iteration_stops_tasks_and_keeps_a_users_cluster(client, tmp_path):
    env = functools.partial(SlowEnv, 0.005)
    collector = daskrl.Collector(env, TagPolicy(), str(tmp_path / "s"), client=client,
                                 envs_per_worker=2, frames_per_batch=100, total_frames=None)
    timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt), collector:
        for _ in collector:
            pass
    timer.cancel()
    assert collector.in_flight == 0 and client.status == "running"
    check_episode_continuity(daskrl.open_store(str(tmp_path / "s")))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(client.processing().values()):
        time.sleep(0.05)
    assert not any(client.processing().values())  # no task of ours still running
    assert client.submit(sum, [1, 2]).result() == 3  # the user's cluster is still usable


def test_garbage_collected_collector_releases_everything(client, tmp_path):
    import gc

    collector = daskrl.Collector("daskrl.testing:Counting-v0", TagPolicy(), str(tmp_path / "s"),
                                 client=client, envs_per_worker=2, frames_per_batch=10,
                                 total_frames=None)
    next(iter(collector))
    [name] = [n for p in client.run(lambda dask_worker: list(dask_worker.plugins)).values()
              for n in p if n.startswith("daskrl-")][:1]
    del collector
    gc.collect()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (client.list_datasets() or any(
            name in p for p in client.run(lambda dask_worker: list(dask_worker.plugins)).values())):
        time.sleep(0.05)
    assert not client.list_datasets()
    assert not any(name in p for p in client.run(lambda dask_worker: list(dask_worker.plugins)).values())


def test_a_store_the_workers_cannot_see_is_refused_at_start(client):
    # memory:// lives in each process: spawn-started workers do not see the learner's, just as
    # workers on other machines do not see a learner's local disk.
    url = "memory://daskrl-not-shared"
    with pytest.raises(daskrl.StoreError, match=re.escape("does not see the store 'memory://daskrl-not-shared' that the learner writes to")):
        daskrl.Collector("daskrl.testing:Counting-v0", TagPolicy(), url, client=client)
    assert not client.list_datasets()


def test_read_only_filesystem_is_refused_before_collection(client, tmpfs):
    import subprocess

    daskrl.TrajectoryStore(str(tmpfs / "s"), read_only=False).initialize()
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    with pytest.raises(daskrl.StoreError, match="Read-only file system"):
        daskrl.Collector("daskrl.testing:Counting-v0", TagPolicy(), str(tmpfs / "s"),
                         client=client)
    assert not client.list_datasets()


def test_full_filesystem_fails_clearly_and_leaves_no_partial_batch(client, tmpfs):
    url = str(tmpfs / "s")
    # Batches of ~200 KiB each (zstd cannot shrink random observations) fill 256 KiB fast.
    env = functools.partial(daskrl.testing.EnvVarEnv, "UNSET", 10_000)
    with daskrl.Collector(env, daskrl.testing.NoisePolicy(64), url, client=client,
                          envs_per_worker=8, frames_per_batch=400, total_frames=None) as c, \
            pytest.raises(daskrl.StoreError, match="No space left on device"):
        for _ in c:
            pass
    store = daskrl.open_store(url)
    for bid in store.batch_ids():  # every visible batch is whole
        assert store.load(bid)["noise"].shape == (50, 8, 64)


def test_embedded_cluster_speaks_tls_and_refuses_plain_clients(tmp_path):
    import dask

    with daskrl.Collector("daskrl.testing:Counting-v0", TagPolicy(), str(tmp_path / "a"),
                          envs_per_worker=2, frames_per_batch=10, total_frames=20,
                          num_workers=1) as collector:
        address = collector.client.scheduler.address
        assert address.startswith("tls://")
        assert len(list(collector)) == 2
        # A client without the credentials is refused, by the TLS address and over plain TCP.
        # (In a subprocess: a failed Client leaves its event loop runner broken.)
        import subprocess
        import sys

        for plain in (address, address.replace("tls://", "tcp://")):
            out = subprocess.run(
                [sys.executable, "-c", "import sys; from distributed import Client; "
                 f"Client({plain!r}, timeout=3); sys.exit(7)"],
                capture_output=True, text=True, timeout=60,
            )
            assert out.returncode not in (0, 7), out  # it raised: no connection was made
            assert re.search(r"(TLS|ssl|Timed out|CommClosed|Stream is closed)", out.stderr), out
    with dask.config.set({"daskrl.embedded-cluster.tls": False}), daskrl.Collector(
            "daskrl.testing:Counting-v0", TagPolicy(), str(tmp_path / "b"), envs_per_worker=2,
            frames_per_batch=10, total_frames=20, num_workers=1) as collector:
        assert collector.client.scheduler.address.startswith("tcp://")  # the documented opt-out


def test_a_store_protocol_without_its_package_says_what_to_install(tmp_path):
    with pytest.raises(daskrl.StoreError, match=r"Install the fsspec backend for this protocol"):
        daskrl.Collector("daskrl.testing:Counting-v0", TagPolicy(), "gcs://bucket/run-1")
