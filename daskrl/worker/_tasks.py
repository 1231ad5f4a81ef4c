"""What the learner asks a worker to do: collect a batch, preload weights, probe the store.

:func:`collect_batch` collects one batch: it readies the policy, runs the stream's envs for
the batch's steps, writes the batch to the store and returns its :class:`BatchHandle`. A
stream (:mod:`daskrl.worker._stream`) calls it for each batch the learner sends it, and
``Collector.submit()`` runs it as a Dask task. It takes a small :class:`BatchTask`; the worker's state is the collector's
:class:`~daskrl.worker._plugin.CollectorPlugin`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import numpy as np
import torch
from distributed import Worker

from daskrl._distributed import running_task_cancelled, this_worker
from daskrl.errors import BatchTimeoutError, EnvError, EnvInfoError, PolicyError, StoreError
from daskrl.store._handles import BatchHandle
from daskrl.weights._cache import WeightsRef
from daskrl.weights._segments import SharedWeights
from daskrl.worker._plugin import CollectorPlugin, collector_plugin

__all__ = ["BatchTask", "collect_batch", "preload_shared_weights", "preload_weights", "probe_store", "with_weights"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BatchTask:
    """What one collection task does; small, sent with every task."""

    batch_id: int
    stream: int
    previous_batch_id: int | None
    """The stream's batch before this one: its envs continue from there."""
    steps: int
    random_steps: int
    weights_version: int
    weights: WeightsRef
    """Where the weights version is (see :data:`~daskrl.weights._cache.WeightsRef`)."""
    env: int = 0
    """The env index the stream collects (its entry of the collection's envs)."""
    newest_ok: bool = False
    """A stream may run it on a newer weights version it was told of (``sync=False``)."""


def with_weights(task: BatchTask, weights: WeightsRef) -> BatchTask:
    """``task`` with its weights fetched from ``weights`` instead."""
    return dataclasses.replace(task, weights=weights)


def preload_weights(plugin_name: str, version: int, weights: WeightsRef) -> str:
    """Fetch, verify and load weights ``version`` on this worker now; return its device."""
    plugin = collector_plugin(this_worker(), plugin_name)
    with plugin.lock:
        plugin.ready_policy(version, weights)
    return str(plugin.device)


async def preload_shared_weights(plugin_name: str, version: int, weights: SharedWeights,
                                 dask_worker: Worker) -> str:
    """:func:`preload_weights` from the learner's shared memory, for ``Client.run`` (a direct
    message to each worker, ~1.5 ms against ~10 ms for a task's round trip): the load runs in a
    thread, so the worker's event loop stays free while a running batch holds the policy."""
    plugin = collector_plugin(dask_worker, plugin_name)

    def load() -> str:
        with plugin.lock:
            plugin.ready_policy(version, weights, fallback=False)
        return str(plugin.device)

    return await asyncio.get_running_loop().run_in_executor(None, load)


def probe_store(plugin_name: str, probe: str, token: str) -> str:
    """Check this worker sees the learner's marker in the store, and leave its own."""
    worker = this_worker()
    store = collector_plugin(worker, plugin_name).get_store()
    seen = store.read_probe(probe, "learner")
    if seen != token:
        raise StoreError(
            f"worker {worker.address} does not see the store {store.url!r} that the learner "
            "writes to (the learner's marker is missing there). A local path is not shared "
            "between machines: use a shared filesystem (FSx, Lustre, NFS) mounted at the same "
            "path everywhere, or an object store URL."
        )
    store.write_probe(probe, worker.address, token)
    return worker.address


def _seed_for(seed: int, batch_id: int) -> int:
    return int(np.random.SeedSequence([seed, 1, batch_id]).generate_state(1)[0])


def collect_batch(plugin_name: str, task: BatchTask) -> BatchHandle | None:
    """Run one batch on this worker, write it to the store, return its handle.

    Returns None, writing nothing, if the task was cancelled while it ran.

    The stream's envs continue into its next batch only if this attempt's batch is the one
    committed: when the write loses to another attempt of the batch (a re-run after the worker
    holding the committed result was lost, or the original after a re-run won), is cancelled
    or fails, the envs are dropped, and the stream's next batch starts fresh episodes.
    """
    worker = this_worker()
    plugin = collector_plugin(worker, plugin_name)
    try:
        with plugin.stream_lock(task.stream):
            ours = False
            try:
                handle, ours = _collect_and_write(plugin, worker, task)
            finally:
                if not ours or plugin.closed:
                    plugin.drop_envset(task.stream)
    finally:
        if plugin.closed:  # the collector closed while this batch ran (see teardown)
            plugin.close_idle()
    return handle


def _collect_and_write(plugin: CollectorPlugin, worker: Worker,
                       task: BatchTask) -> tuple[BatchHandle | None, bool]:
    """``(handle, committed by this attempt)``: the rollout and its write."""
    cfg = plugin.config
    with plugin.lock:
        policy = plugin.ready_policy(task.weights_version, task.weights)
        device = plugin.device
        assert device is not None  # set by ready_policy
        restarts = 0
        while True:
            torch.manual_seed(_seed_for(cfg.seed, task.batch_id))
            envset = plugin.envset(task.stream, task.previous_batch_id, task.batch_id, restarts,
                                   env=task.env)
            try:
                arrays, stats = envset.collect(
                    policy, device, task.steps, task.batch_id,
                    random_steps=task.random_steps, reset=cfg.reset_at_each_iter,
                    batch_timeout=cfg.batch_timeout,
                )
                break
            except PolicyError as e:  # the policy raised on this worker: no restart helps
                plugin.drop_envset(task.stream)  # they stopped mid-batch
                raise PolicyError(f"{e}\n[worker {worker.address}, weights version "
                                  f"{task.weights_version}]") from e
            except (EnvError, BatchTimeoutError) as e:
                # The envs' state is unknown now: they are closed and rebuilt.
                plugin.drop_envset(task.stream)
                where = f"[worker {worker.address}, weights version {task.weights_version}]"
                retry = (cfg.on_env_error == "restart" and restarts < cfg.max_env_restarts
                         and not isinstance(e, (BatchTimeoutError, EnvInfoError)))
                if not retry:
                    raise type(e)(f"{e}\n{where}") from e
                restarts += 1
                logger.warning("batch %d: restarting the envs of stream %d after: %s %s",
                               task.batch_id, task.stream, str(e).splitlines()[0], where)
    t0 = time.perf_counter()
    handle = BatchHandle(
        store_url=plugin.store_url,
        batch_id=task.batch_id,
        frames=task.steps * cfg.envs_per_worker,
        weights_version=task.weights_version,
        policy_lag=0,
        worker=worker.address,
        device=str(device),
        episode_returns=stats["episode_returns"],
        episode_lengths=stats["episode_lengths"],
        path="",
        shape=(task.steps, cfg.envs_per_worker),
        rollout_seconds=stats["rollout_seconds"],
        env_restarts=restarts,
        env=task.env,
        episode_stats=stats.get("episode_stats", ()),
    )
    if running_task_cancelled(worker):
        # The learner cancelled this batch while it ran: its result would be thrown away, so
        # it is not written (a batch cancelled once its write has begun is committed).
        logger.debug("batch %d cancelled before its write; not committed", task.batch_id)
        return None, False
    meta = {**handle.record(), "stream": task.stream}
    if envset.policy_state is not None:  # a recurrent policy's: what policy_state holds
        meta["policy_state"] = cfg.store_policy_state
    store = plugin.get_store()
    path, committed = store.write_batch(task.batch_id, arrays, meta, cfg.compression)
    if not committed:  # another attempt of this batch won: hand back the committed one
        logger.info("batch %d was committed by another attempt; the envs of stream %d start "
                    "new episodes", task.batch_id, task.stream)
        return store.handle(task.batch_id), False
    return dataclasses.replace(handle, path=path, write_seconds=time.perf_counter() - t0,
                               needs_options=bool(store.storage_options)), True
