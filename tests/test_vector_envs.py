"""Vector envs collected through ``Collector`` and ``daskrl collect`` (in this process, on the
session's cluster) on real clusters.

For every kind (gymnasium's ``SyncVectorEnv`` and ``AsyncVectorEnv``, a native ``VectorEnv``,
``vector_entry_point`` envs, envpool) and every autoreset mode, the store holds only real
transitions, the true final observations, continuous episodes and exactly the frames asked for.
"""

from __future__ import annotations

import functools
import os
import re
import signal
import time

import gymnasium as gym
import numpy as np
import pytest
from cli_cluster import cli_cluster, scheduler_address
from cli_inprocess import daskrl_main
from distributed import Client
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv

import daskrl
from daskrl import BatchTimeoutError, ConfigError, EnvError
from daskrl.deploy import local_cluster
from daskrl.testing import (
    ConstantPolicy,
    CountingEnv,
    CountingVectorEnv,
    FaultyEnv,
    TagPolicy,
    check_episode_continuity,
)

MODES = ("NextStep", "SameStep", "Disabled")
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def parent_cluster():
    """The embedded cluster's set-up (its workers may start processes), without TLS."""
    with local_cluster(2, tls=False) as cluster, Client(cluster, set_as_default=False) as client:
        yield cluster, client


def _sync_counting(mode: str, n: int = 3, length: int = 3, cls=SyncVectorEnv, **kw):
    return lambda: cls([functools.partial(CountingEnv, length + i) for i in range(n)],
                       autoreset_mode=mode, **kw)


def _async_counting(mode: str, n: int = 3, length: int = 3):
    # A Dask worker's start method is spawn (seconds per sub-process, importing the env's
    # modules anew); fork starts these in a fraction of a second.
    return _sync_counting(mode, n, length, cls=AsyncVectorEnv, context="fork")


def check_counting_store(url: str, lengths, handles, total: int):
    """Every stored transition real, every end the true final observation, episodes
    continuous across batches, the handles' episode statistics those of the store."""
    reader = daskrl.open_store(url)
    assert reader.frames == total == sum(h.frames for h in handles)
    report = check_episode_continuity(reader)
    for h in handles:
        b = {k: v.numpy() for k, v in reader.load(h.batch_id).items()}
        obs, nxt = b["observation"], b["next_observation"]
        assert obs.shape == (h.frames // len(lengths), len(lengths), 2)
        assert np.array_equal(nxt, obs + np.array([0, 1]))  # no reset step stored
        assert np.array_equal(b["reward"], nxt[..., 1])
        assert np.array_equal(b["terminated"], nxt[..., 1] == np.asarray(lengths))
        assert not b["truncated"].any()
        ended = sorted(int(n) for n in b["step"][b["terminated"]] + 1)
        assert sorted(h.episode_lengths) == ended
        assert sorted(h.episode_returns) == sorted(n * (n + 1) / 2 for n in ended)
    assert report.ended > 0
    return report


@pytest.mark.parametrize("mode", MODES)
def test_sync_vector_env_factory_in_each_autoreset_mode(client, tmp_path, mode):
    url = str(tmp_path / "s")
    with daskrl.Collector(_sync_counting(mode), TagPolicy(), url, client=client,
                          frames_per_batch=21, total_frames=126, num_workers=2) as c:
        assert c.config.envs_per_worker == 3  # the vector env's num_envs
        handles = list(c)
    check_counting_store(url, [3, 4, 5], handles, 126)
    assert daskrl.open_store(url).runs()[0]["settings"]["envs_per_worker"] == 3


@pytest.mark.parametrize("mode", MODES)
def test_native_vector_env_in_each_autoreset_mode(client, tmp_path, mode):
    """CountingVectorEnv cannot reset one sub-env in NEXT_STEP mode: its reset steps are
    skipped, its columns fill at their own pace, and episodes still run on across batches."""
    url = str(tmp_path / "s")
    env = functools.partial(CountingVectorEnv, 3, 1, mode)
    with daskrl.Collector(env, TagPolicy(), url, client=client, frames_per_batch=12,
                          total_frames=96, num_workers=2) as c:
        handles = list(c)
    check_counting_store(url, [1, 2, 3], handles, 96)


def test_vector_entry_point_env_by_id(client, tmp_path):
    """gym.make_vec("CartPole-v1", vectorization_mode="vector_entry_point"): no reset step
    (reward 0) is stored, and the terminal next observations are past CartPole's limits."""
    url = str(tmp_path / "s")
    with daskrl.Collector("CartPole-v1", ConstantPolicy(0), url, client=client,
                          envs_per_worker=4, frames_per_batch=160, total_frames=640,
                          vectorization_mode="vector_entry_point") as c:
        handles = list(c)
    reader = daskrl.open_store(url)
    check_episode_continuity(reader)
    assert reader.frames == 640 and reader.runs()[0]["settings"]["vectorization_mode"] == (
        "vector_entry_point")
    for h in handles:
        b = {k: v.numpy() for k, v in reader.load(h.batch_id).items()}
        assert (b["reward"] == 1).all()
        nxt = b["next_observation"]
        outside = (np.abs(nxt[..., 0]) > 2.4) | (np.abs(nxt[..., 2]) > 12 * 2 * np.pi / 360)
        assert np.array_equal(outside, b["terminated"])
        assert sorted(h.episode_lengths) == sorted((b["step"][b["terminated"]] + 1).tolist())


def test_envs_per_worker_other_than_num_envs_is_an_error(client, tmp_path):
    with pytest.raises(ConfigError, match=re.escape(
            "builds a vector env of num_envs=3, but envs_per_worker=4 was given")):
        daskrl.Collector(_sync_counting("NextStep"), TagPolicy(), str(tmp_path / "s"),
                         client=client, envs_per_worker=4, frames_per_batch=12)


@pytest.mark.parametrize("mode", MODES)
def test_async_vector_env_on_the_embedded_cluster(parent_cluster, tmp_path, mode):
    _, client = parent_cluster
    url = str(tmp_path / "s")
    with daskrl.Collector(_async_counting(mode), TagPolicy(), url,
                          client=client, frames_per_batch=21, total_frames=84,
                          num_workers=2) as c:
        handles = list(c)
    check_counting_store(url, [3, 4, 5], handles, 84)


def test_async_vector_env_by_id_in_a_collector_of_its_own(tmp_path):
    """client=None: the collector's own embedded cluster (TLS, as by default)."""
    url = str(tmp_path / "s")
    with daskrl.Collector("daskrl.testing:Counting-v0", TagPolicy(), url, envs_per_worker=2,
                          frames_per_batch=20, total_frames=60, num_workers=1,
                          vectorization_mode="async",
                          vector_kwargs={"autoreset_mode": "SameStep"}) as c:
        handles = list(c)
    check_counting_store(url, [5, 5], handles, 60)


def test_async_vector_env_survives_a_worker_restart(parent_cluster, tmp_path):
    """A worker killed mid-collection is restarted by its nanny, which must start it
    non-daemonic again for its AsyncVectorEnv."""
    _, client = parent_cluster
    url = str(tmp_path / "s")
    with daskrl.Collector(_async_counting("NextStep", n=2), TagPolicy(),
                          url, client=client, frames_per_batch=20, total_frames=None,
                          num_workers=2) as c:
        handles, killed = [], None
        for h in c:
            handles.append(h)
            if len(handles) == 2:
                killed = h.worker
                os.kill(client.run(os.getpid, workers=[killed])[killed], signal.SIGKILL)
            first = {x.worker for x in handles[:2]}
            restarted = {x.worker for x in handles[2:]} - first
            if len(handles) >= 12 and restarted:
                break  # a batch ran on the restarted worker
        assert killed is not None and restarted, [h.worker for h in handles]
    reader = daskrl.open_store(url)
    check_episode_continuity(reader)
    for h in reader:
        b = {k: v.numpy() for k, v in h.load().items()}
        assert np.array_equal(b["next_observation"], b["observation"] + np.array([0, 1]))


def test_async_vector_env_on_daemonic_workers_is_a_clear_error(client, tmp_path):
    with pytest.raises(EnvError, match=re.escape(
            "its process is daemonic. The embedded cluster's workers may have children; for "
            "other clusters set the dask config distributed.worker.daemon: False")):
        daskrl.Collector(_async_counting("NextStep"), TagPolicy(), str(tmp_path / "s"),
                         client=client, frames_per_batch=12, total_frames=24)


def test_async_vector_env_on_cli_workers_with_daemon_false(tmp_path):
    """What docs/env-kinds.md tells users of other clusters: `dask worker` with
    DASK_DISTRIBUTED__WORKER__DAEMON=False."""
    env = {"DASK_DISTRIBUTED__WORKER__DAEMON": "False"}
    url = str(tmp_path / "s")
    (tmp_path / "cluster").mkdir()
    with cli_cluster(tmp_path / "cluster", n_workers=1, env=env) as (sched, procs):
        try:
            client = Client(scheduler_address(sched), set_as_default=False, timeout=60)
            client.wait_for_workers(1, timeout=120)
        except (OSError, TimeoutError):
            pytest.fail(f"the CLI cluster did not start:\n{procs.logs()}")
        with client, daskrl.Collector(_async_counting("NextStep"),
                                      TagPolicy(), url, client=client, frames_per_batch=15,
                                      total_frames=45) as c:
            handles = list(c)
    check_counting_store(url, [3, 4, 5], handles, 45)


def test_sub_process_error_names_the_env_index(parent_cluster, tmp_path):
    _, client = parent_cluster
    factories = [functools.partial(CountingEnv, 3),
                 functools.partial(FaultyEnv, "raise", at=6, token="async-index")]
    with (
        daskrl.Collector(lambda: AsyncVectorEnv(factories, context="fork"), TagPolicy(),
                         str(tmp_path / "s"), client=client, frames_per_batch=20,
                         total_frames=None, num_workers=1) as c,
        pytest.raises(EnvError, match=re.escape("(env index 1) raised in step() at step 5 of "
                                                "batch 0")) as info,
    ):
        list(c)
    assert "injected step failure" in str(info.value)
    assert "--- the sub-process's traceback ---" in str(info.value)
    assert "_faulty_env.py" in str(info.value)  # where it was raised, in the sub-process


def _children(client) -> dict[str, int]:
    """Each worker's live child processes."""
    return client.run(lambda: len(__import__("multiprocessing").active_children()))


def test_async_step_past_the_batch_timeout_is_stopped(parent_cluster, tmp_path):
    _, client = parent_cluster
    factories = [functools.partial(FaultyEnv, "hang", at=3, hang=60, token="async-hang")] * 2
    with (
        daskrl.Collector(lambda: AsyncVectorEnv(factories, context="fork"), TagPolicy(),
                         str(tmp_path / "s"), client=client, frames_per_batch=20,
                         total_frames=None, num_workers=1, batch_timeout=3) as c,
        # each sub-process counts its own steps: both hang in their third step
        pytest.raises(BatchTimeoutError, match="ran past its deadline of 3s at step 2"),
    ):
        list(c)
    assert set(_children(client).values()) == {0}  # the hung sub-processes were terminated


class _MarkedHang(FaultyEnv):
    """``FaultyEnv("hang", once=True)`` that leaves a file named by its process id in ``marks``
    as its hanging step begins: the test then knows the batch waits on that step."""

    def __init__(self, marks: str, at: int, hang: float) -> None:
        super().__init__("hang", at=at, hang=hang, once=True, token="close-mid-step")
        self.marks, self.steps = marks, 0

    def step(self, action):
        self.steps += 1
        if self.steps == self.at:  # one env per sub-process: FaultyEnv counts these steps too
            open(os.path.join(self.marks, str(os.getpid())), "w").close()
        return super().step(action)


def test_collector_closed_mid_step_leaves_the_envs_to_the_batch(parent_cluster, tmp_path):
    """The collector closes while a batch waits on its AsyncVectorEnv's step: the worker's
    teardown waits for the batch to end (so nothing reaches the store after close()) and
    leaves its envs to it, which closes them as it ends. (Closed by the teardown too, from the
    worker's event loop, two threads read the same pipes: the batch hung in its next call, or
    the sub-processes were left behind.)"""
    _, client = parent_cluster
    marks = tmp_path / "hanging"
    marks.mkdir()
    factories = [functools.partial(_MarkedHang, str(marks), at=2, hang=2)] * 2
    c = daskrl.Collector(lambda: AsyncVectorEnv(factories, context="fork"), TagPolicy(),
                         str(tmp_path / "s"), client=client, frames_per_batch=20,
                         total_frames=None, num_workers=1)
    try:
        c.submit()
        deadline = time.monotonic() + 30
        while len(os.listdir(marks)) < 2:  # both sub-processes are in the step that sleeps 2 s
            assert time.monotonic() < deadline, (os.listdir(marks), _children(client))
            time.sleep(0.02)
    finally:
        c.close()
    # close() returned once the batch had ended and closed its envs
    assert set(_children(client).values()) == {0}
    executing = client.run(lambda dask_worker: len(dask_worker.state.executing))
    assert set(executing.values()) == {0}
    # each worker is free for the next task
    for w in _children(client):
        assert client.submit(sum, [1, 2], workers=[w], pure=False).result(timeout=10) == 3


def test_envpool_pools_seeded_per_stream(client, tmp_path):
    import envpool  # daskrl[envpool], in the test extra

    def make_pool():
        return envpool.make_gymnasium("CartPole-v1", num_envs=4, seed=daskrl.env_seed())

    url = str(tmp_path / "s")
    with daskrl.Collector(make_pool, ConstantPolicy(0), url, client=client,
                          frames_per_batch=160, total_frames=640, num_workers=2) as c:
        handles = list(c)
    reader = daskrl.open_store(url)
    check_episode_continuity(reader)
    first = {}
    for h in handles:
        b = {k: v.numpy() for k, v in reader.load(h.batch_id).items()}
        assert (b["reward"] == 1).all()  # envpool's reset steps are not stored
        nxt = b["next_observation"]
        outside = (np.abs(nxt[..., 0]) > 2.4) | (np.abs(nxt[..., 2]) > 12 * 2 * np.pi / 360)
        assert np.array_equal(outside, b["terminated"])
        first.setdefault(reader.records()[h.batch_id]["stream"], b["observation"][0])
    assert len(first) == 2 and not np.array_equal(first[0], first[1])  # seeds per stream


def test_cli_collects_a_vector_env(cluster, tmp_path):
    store = tmp_path / "s"
    out = daskrl_main(
        "collect", "--env", "daskrl.testing:Counting-v0",
        "--vectorization-mode", "sync", "--vector-kwargs", '{"autoreset_mode": "SameStep"}',
        "--envs-per-worker", "2", "--frames", "40", "--frames-per-batch", "20", "--workers",
        "1", "--store", str(store), "--no-progress", "--scheduler", cluster.scheduler_address,
        cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    reader = daskrl.open_store(str(store))
    assert reader.frames == 40
    assert reader.runs()[0]["settings"]["vectorization_mode"] == "sync"
    check_episode_continuity(reader)
    for h in reader:
        b = {k: v.numpy() for k, v in h.load().items()}
        assert np.array_equal(b["next_observation"], b["observation"] + np.array([0, 1]))


def test_gymnasium_vector_env_wrapper_is_a_vector_env(client, tmp_path):
    """A vector wrapper (here gymnasium's vector RecordEpisodeStatistics) around a vector env
    is stepped like the env it wraps."""
    url = str(tmp_path / "s")
    make = _sync_counting("NextStep")

    def wrapped():
        return gym.wrappers.vector.RecordEpisodeStatistics(make())

    with daskrl.Collector(wrapped, TagPolicy(), url, client=client, frames_per_batch=21,
                          total_frames=42, num_workers=1) as c:
        handles = list(c)
    check_counting_store(url, [3, 4, 5], handles, 42)
