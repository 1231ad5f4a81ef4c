"""Worker side: a plugin that keeps each worker's policy and envs, and the collection task.

:class:`CollectorPlugin` is registered once per collector; Dask installs it on every worker,
replacement workers included.  Its ``setup`` sets ``env_vars`` and picks the device; its state
(the loaded policy and its weights version, one :class:`~daskrl.worker._rollout.EnvSet` per stream)
lives until ``teardown``, when the collector closes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import torch
from distributed import Future, WorkerPlugin, get_client, get_worker

from daskrl.config import CollectorConfig
from daskrl.errors import (
    BatchTimeoutError,
    DaskrlError,
    EnvError,
    PolicyError,
    StoreError,
    WeightsNotSharedError,
)
from daskrl.store._handles import BatchHandle
from daskrl.store._store import TrajectoryStore
from daskrl.weights._shm import HostCopies, SharedWeights, SharedWeightsReader
from daskrl.weights._snapshot import PolicySpec, WeightsSnapshot, load_weights
from daskrl.worker._devices import DeviceSetting, resolve_device
from daskrl.worker._envs import EnvSpec, apply_env_vars
from daskrl.worker._rollout import EnvSet

__all__ = ["BatchTask", "CollectorPlugin", "collect_batch"]

logger = logging.getLogger(__name__)

WEIGHTS_FETCH_TIMEOUT = 120.0

IN_PROCESS_WEIGHTS: dict[str, WeightsSnapshot] = {}
"""Published weights by name, for workers that share the learner's process (``processes=False``):
they read the learner's snapshot in place. (Futures of in-process clusters are not serialized,
so a worker's client cannot resolve the published one.)"""


WeightsRef = str | SharedWeights
"""How a task finds its weights version: the data key it was scattered under, or the manifest
of its copy in the learner's shared memory."""


def weights_name(plugin_name: str, version: int) -> str:
    """Name under which a weights version is published (workers fetch it by this name)."""
    return f"{plugin_name}-weights-v{version}"


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
    """Where the weights version is (see :data:`WeightsRef`)."""


class CollectorPlugin(WorkerPlugin):
    """Per-worker state of one collector (policy, envs, store)."""

    def __init__(
        self,
        name: str,
        env: EnvSpec,
        policy: PolicySpec,
        config: CollectorConfig,
        device: DeviceSetting,
        env_vars: Mapping[str, str],
        store_url: str,
        storage_options: Mapping[str, Any],
    ) -> None:
        self.name = name
        self.env = env
        self.policy_spec = policy
        self.config = config
        self.device_setting = device
        self.env_vars = dict(env_vars)
        self.store_url = store_url
        self.storage_options = dict(storage_options)
        self._lock = threading.Lock()
        self._stream_locks: dict[int, threading.Lock] = {}
        self._reset_state()

    def _reset_state(self) -> None:
        self.device: torch.device | None = None
        self.policy: torch.nn.Module | None = None
        self.version: int | None = -1
        self.weight_loads = 0  # fetches of a new version: one per version on this worker
        # (version, where from): "in-process", "shared-memory", "seed" (this worker's own
        # memory), "host-copy" (another worker of this host fetched it) or "dask" (fetched).
        self.weight_sources: list[tuple[int, str]] = []
        self.envsets: dict[int, EnvSet] = {}
        self.store: TrajectoryStore | None = None
        self.shared = SharedWeightsReader()  # mappings of the learner's shared-memory weights
        self.host_copies = HostCopies(self.name)  # this host's copies of Dask-sent versions
        self.worker_name = "?"
        self.worker_address = "?"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for k in ("_lock", "_stream_locks", "policy", "envsets", "store", "device", "shared",
                  "host_copies"):
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._stream_locks = {}
        self.policy, self.envsets, self.store, self.device = None, {}, None, None
        self.shared = SharedWeightsReader()
        self.host_copies = HostCopies(self.name)

    def setup(self, worker: Any) -> None:
        apply_env_vars(self.env_vars)
        self.worker_name = str(worker.name)
        self.worker_address = worker.address

    def teardown(self, worker: Any) -> None:
        for envset in self.envsets.values():
            try:
                envset.close()
            except Exception:  # closing is best effort; the worker keeps running
                logger.warning("env close failed on %s", self.worker_address, exc_info=True)
        self.shared.close()
        self.host_copies.close()
        self._reset_state()

    # -- state used by tasks -----------------------------------------------------------------
    def ready_policy(self, version: int, weights: WeightsRef,
                     fallback: bool = True) -> torch.nn.Module:
        """The policy with weights ``version`` on this worker's device (loaded on change).

        The weights come from the learner's shared memory (``weights`` is its manifest), from
        this worker's own memory when the broadcast put a copy here, or else from the dataset
        the learner published for the version. If shared memory cannot be read here,
        ``fallback`` looks for a published copy first (the learner may have switched to Dask
        transfers meanwhile; this needs a task thread).
        """
        if self.device is None:
            self.device = resolve_device(self.device_setting, self.worker_name, self.worker_address)
        if self.policy is None:
            self.policy = self.policy_spec.build(self.device)
        if self.version != version:
            name = weights_name(self.name, version)
            self.version = None  # a failed load may leave a mix: no version is loaded
            in_process = IN_PROCESS_WEIGHTS.get(name)
            if in_process is not None:
                load_weights(self.policy, in_process)
                self.weight_sources.append((version, "in-process"))
            elif isinstance(weights, SharedWeights):
                try:
                    self.shared.load(self.policy, weights, f"worker {self.worker_address}")
                    self.weight_sources.append((version, "shared-memory"))
                except WeightsNotSharedError:
                    # The learner switches to Dask transfers when it hears of this.
                    if not fallback:
                        raise
                    published = get_client().get_dataset(name, default=None)
                    if published is None:
                        raise
                    load_weights(self.policy, published.result(timeout=WEIGHTS_FETCH_TIMEOUT))
                    self.weight_sources.append((version, "dask"))
            else:
                self._load_through_dask(version, name, weights)
            self.version = version
            self.weight_loads += 1
        return self.policy

    def _load_through_dask(self, version: int, name: str, key: str) -> None:
        """Load a version the learner sent through Dask: from this worker's memory (it is
        the version's seed), from this host's copy (another worker of the host fetched it),
        or fetched from a worker holding it, then left as this host's copy."""
        assert self.policy is not None
        local = _local_data(key)
        if local is not None:
            load_weights(self.policy, local)
            self.weight_sources.append((version, "seed"))
            return
        copy_key = f"v{version}"
        copy = self.host_copies.manifest(copy_key, wait=False)
        claimed = copy is None and self.host_copies.claim(copy_key)
        if copy is None and not claimed:
            copy = self.host_copies.manifest(copy_key, wait=True)
        if copy is not None:
            try:
                self.shared.load(self.policy, copy, f"worker {self.worker_address}")
                self.weight_sources.append((version, "host-copy"))
                return
            except WeightsNotSharedError:  # removed meanwhile: fetch it
                pass
        try:
            snap = self._fetch_weights(version, name)
            load_weights(self.policy, snap)  # verifies the learner's checksums
        except BaseException:
            if claimed:
                self.host_copies.release(copy_key)
            raise
        self.weight_sources.append((version, "dask"))
        if claimed:
            self.host_copies.publish(copy_key, snap)

    def _fetch_weights(self, version: int, name: str) -> WeightsSnapshot:
        """Fetch the published weights ``name``; wait out a re-publication if they were lost."""
        deadline = time.monotonic() + WEIGHTS_FETCH_TIMEOUT
        client = get_client()
        while True:
            # A published dataset: the scheduler registers this worker's client as wanting the
            # key, and the data comes straight from a worker holding it.
            fut: Future | None = client.get_dataset(name, default=None)
            if fut is None:
                raise DaskrlError(
                    f"worker {self.worker_address}: weights version {version} ({name!r}) is no "
                    "longer published; was the collector closed?"
                )
            try:
                return fut.result(timeout=2.0)
            except Exception as e:
                # Lost with the worker that held it: the learner scatters it again under
                # the same name.
                if time.monotonic() > deadline:
                    raise DaskrlError(
                        f"worker {self.worker_address} could not fetch weights version "
                        f"{version} within {WEIGHTS_FETCH_TIMEOUT:.0f}s; is the learner alive?"
                    ) from e

    def envset(self, task: BatchTask, attempt: int = 0) -> EnvSet:
        """The stream's envs, continuing from its previous batch where this worker has them.

        Envs left behind by a batch that is not the stream's previous one (the stream ran
        elsewhere meanwhile) are stale: they are replaced, seeded from this batch's id so that
        no episode is repeated.
        """
        envset = self.envsets.get(task.stream)
        if envset is not None and envset.last_batch_id != task.previous_batch_id:
            envset.close()
            envset = None
        if envset is None:
            fresh = task.previous_batch_id is None and attempt == 0
            restart = () if fresh else (task.batch_id, attempt)
            envset = EnvSet(self.env, self.config.envs_per_worker, self.config.seed,
                            task.stream, restart)
            self.envsets[task.stream] = envset
        return envset

    def stream_lock(self, stream: int) -> threading.Lock:
        """Held by a batch of ``stream`` from its rollout until its write is decided, so the
        stream's next batch never continues envs whose batch may yet be discarded."""
        return self._stream_locks.setdefault(stream, threading.Lock())  # atomic (the GIL)

    def drop_envset(self, stream: int) -> None:
        """Close and forget a stream's envs (after an error: their state is unknown)."""
        envset = self.envsets.pop(stream, None)
        if envset is not None:
            try:
                envset.close()
            except Exception:  # a broken env may fail to close too
                logger.debug("closing the envs of stream %d failed", stream, exc_info=True)

    def get_store(self) -> TrajectoryStore:
        if self.store is None:
            self.store = TrajectoryStore(self.store_url, self.storage_options, read_only=False)
        return self.store


def _local_data(key: str) -> WeightsSnapshot | None:
    try:
        return get_worker().data.get(key)
    except Exception:  # spilled and unreadable, or a worker without this mapping
        return None


def preload_weights(plugin_name: str, version: int, weights: WeightsRef) -> str:
    """Fetch, verify and load weights ``version`` on this worker now; return its device."""
    plugin: CollectorPlugin = get_worker().plugins[plugin_name]
    with plugin._lock:
        plugin.ready_policy(version, weights)
    return str(plugin.device)


async def preload_shared_weights(plugin_name: str, version: int, weights: SharedWeights,
                                 dask_worker: Any = None) -> str:
    """:func:`preload_weights` from the learner's shared memory, for ``Client.run`` (a direct
    message to each worker, ~1.5 ms against ~10 ms for a task's round trip): the load runs in a
    thread, so the worker's event loop stays free while a running batch holds the policy."""
    plugin: CollectorPlugin = dask_worker.plugins[plugin_name]

    def load() -> str:
        with plugin._lock:
            plugin.ready_policy(version, weights, fallback=False)
        return str(plugin.device)

    return await asyncio.get_running_loop().run_in_executor(None, load)


def probe_store(plugin_name: str, probe: str, token: str) -> str:
    """Check this worker sees the learner's marker in the store, and leave its own."""
    worker = get_worker()
    plugin: CollectorPlugin = worker.plugins[plugin_name]
    store = plugin.get_store()
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
    import numpy as np

    return int(np.random.SeedSequence([seed, 1, batch_id]).generate_state(1)[0])


def _cancelled(worker: Any) -> bool:
    """True if the task running in this thread was cancelled (its result is not wanted)."""
    try:
        ts = worker.state.tasks.get(worker.get_current_task())
    except Exception:  # not inside a task, or worker internals changed: assume wanted
        return False
    return ts is not None and ts.state == "cancelled"


def collect_batch(plugin_name: str, task: BatchTask) -> BatchHandle | None:
    """Run one batch on this worker, write it to the store, return its handle.

    Returns None, writing nothing, if the task was cancelled while it ran.

    The stream's envs continue into its next batch only if this attempt's batch is the one
    committed: when the write loses to another attempt of the batch (a re-run after the worker
    holding the committed result was lost, or the original after a re-run won), is cancelled
    or fails, the envs are dropped, and the stream's next batch starts fresh episodes.
    """
    worker = get_worker()
    plugin: CollectorPlugin = worker.plugins[plugin_name]
    with plugin.stream_lock(task.stream):
        ours = False
        try:
            handle, ours = _collect_and_write(plugin, worker, task)
        finally:
            if not ours:
                plugin.drop_envset(task.stream)
        return handle


def _collect_and_write(plugin: CollectorPlugin, worker: Any,
                       task: BatchTask) -> tuple[BatchHandle | None, bool]:
    """``(handle, committed by this attempt)``: the rollout and its write."""
    cfg = plugin.config
    with plugin._lock:
        policy = plugin.ready_policy(task.weights_version, task.weights)
        restarts = 0
        while True:
            torch.manual_seed(_seed_for(cfg.seed, task.batch_id))
            envset = plugin.envset(task, restarts)
            try:
                arrays, stats = envset.collect(
                    policy, plugin.device, task.steps, task.batch_id,  # type: ignore[arg-type]
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
                         and not isinstance(e, BatchTimeoutError))
                if not retry:
                    raise type(e)(f"{e}\n{where}") from e
                restarts += 1
                logger.warning("batch %d: restarting the envs of stream %d after: %s %s",
                               task.batch_id, task.stream, str(e).splitlines()[0], where)
    t0 = time.perf_counter()
    handle = BatchHandle(
        store=plugin.store_url,
        batch_id=task.batch_id,
        frames=task.steps * cfg.envs_per_worker,
        weights_version=task.weights_version,
        policy_lag=0,
        worker=worker.address,
        device=str(plugin.device),
        episode_returns=stats["episode_returns"],
        episode_lengths=stats["episode_lengths"],
        path="",
        shape=(task.steps, cfg.envs_per_worker),
        rollout_seconds=stats["rollout_seconds"],
        env_restarts=restarts,
    )
    if _cancelled(worker):
        # The learner cancelled this batch while it ran: its result would be thrown away, so
        # it is not written (a batch cancelled once its write has begun is committed).
        logger.debug("batch %d cancelled before its write; not committed", task.batch_id)
        return None, False
    meta = {**handle.record(), "stream": task.stream}
    store = plugin.get_store()
    path, committed = store.write_batch(task.batch_id, arrays, meta, cfg.compression)
    if not committed:  # another attempt of this batch won: hand back the committed one
        logger.info("batch %d was committed by another attempt; the envs of stream %d start "
                    "new episodes", task.batch_id, task.stream)
        return store.handle(task.batch_id), False
    return dataclasses.replace(handle, path=path, write_seconds=time.perf_counter() - t0,
                               needs_options=bool(store.storage_options)), True
