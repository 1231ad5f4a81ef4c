"""The worker plugin: one collector's state on each Dask worker, from setup to teardown.

:class:`CollectorPlugin` is registered once per collector; Dask installs it on every worker,
replacement workers included.  Its ``setup`` sets ``env_vars`` and names the worker; its state
(the device, the policy and the weights version loaded in it, one
:class:`~daskrl.worker._rollout.EnvSet` per stream, the store) lives until ``teardown``, when
the collector closes.  What tasks do with that state is in :mod:`daskrl.worker._tasks`; how
weights versions get into the policy is in :mod:`daskrl.weights._cache`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import torch
from distributed import Worker, WorkerPlugin

from daskrl._process import process_token
from daskrl._settings import DeviceSetting
from daskrl.config import CollectorConfig
from daskrl.errors import CollectorClosedError
from daskrl.store._store import TrajectoryStore
from daskrl.weights._cache import WeightsCache, WeightsRef
from daskrl.weights._snapshot import PolicySpec
from daskrl.worker._devices import resolve_device
from daskrl.worker._envs import EnvSpec, apply_env_vars, check_may_start_processes
from daskrl.worker._rollout import EnvSet
from daskrl.worker._threads import size_torch_threads

__all__ = ["CollectorPlugin", "collector_plugin"]

logger = logging.getLogger(__name__)

TEARDOWN_WAIT_S = 10.0
"""How long a worker's teardown waits for the collector's running batches to end (committed or
discarded) before it leaves them to finish on their own (within the learner's call_timeout)."""


class CollectorPlugin(WorkerPlugin):
    """Per-worker state of one collector (policy, envs, store)."""

    def __init__(
        self,
        name: str,
        env: EnvSpec | tuple[EnvSpec, ...],
        policy: PolicySpec,
        config: CollectorConfig,
        device: DeviceSetting,
        env_vars: Mapping[str, str],
        store_url: str,
        storage_options: Mapping[str, Any],
        resumed: bool = False,
    ) -> None:
        self.name = name
        self.resumed = resumed
        """A resumed run (``resume=``): its streams' first envs seed as rebuilt envs do, from
        the batch id, so that they do not replay the env streams of the run it resumes."""
        self.envs = tuple(env) if isinstance(env, tuple) else (env,)
        """The collection's envs, by env index."""
        self.policy_spec = policy
        self.config = config
        self.device_setting = device
        self.env_vars = dict(env_vars)
        self.store_url = store_url
        self.storage_options = dict(storage_options)
        self.worker_name = "?"
        self.worker_address = "?"
        self.learner_process = process_token()
        """The learner's process: a worker in it leaves torch's threads to the learner."""
        self._init_local()

    def _init_local(self) -> None:
        """The state that lives on one worker only (never pickled)."""
        self.lock = threading.Lock()
        """Held while the policy is loaded or runs (one batch at a time uses it)."""
        self._stream_locks: dict[int, threading.Lock] = {}
        self.device: torch.device | None = None
        self.policy: torch.nn.Module | None = None
        self.version: int | None = -1
        """The weights version loaded in :attr:`policy`; None after a failed load (the policy
        may hold a mix), -1 before the first."""
        self.weight_loads = 0
        """Loads of a new version: one per version on this worker."""
        self.envsets: dict[int, EnvSet] = {}
        self.store: TrajectoryStore | None = None
        self.weights = WeightsCache(self.name, f"worker {self.worker_address}",
                                    store=self.get_store)
        self.closed = False
        """Torn down (the collector closed): batches still running close what they held."""

    @property
    def weight_sources(self) -> list[tuple[int, str]]:
        """``(version, where from)`` per version loaded: "in-process", "shared-memory",
        "seed" (this worker's own memory), "host-copy" (another worker of this host fetched
        it), "tree" (fetched from another host in the version's fan-out tree), "dask" (fetched
        from the seed) or "store" (read from the store)."""
        return self.weights.sources

    def streams(self) -> dict[int, int | None]:
        """The streams whose envs live on this worker, with the batch each collected last."""
        return {stream: envset.last_batch_id for stream, envset in self.envsets.items()}

    def __getstate__(self) -> dict[str, Any]:
        keep = ("name", "envs", "policy_spec", "config", "device_setting", "env_vars",
                "store_url", "storage_options", "worker_name", "worker_address", "resumed",
                "learner_process")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_local()

    def setup(self, worker: Worker) -> None:
        apply_env_vars(self.env_vars)
        if self.learner_process != process_token():
            size_torch_threads(worker.state.nthreads, self.env_vars, f"worker {worker.address}")
        self.worker_name = str(worker.name)
        self.worker_address = worker.address
        self.weights.where = f"worker {self.worker_address}"
        self.weights.attach(worker)
        for spec in self.envs:
            check_may_start_processes(spec, f"worker {self.worker_address}")

    async def teardown(self, worker: Worker) -> None:
        # Runs on the worker's event loop, maybe while a batch of this collector still runs
        # (a cancelled task runs on to its end, and commits if its write had begun). Waiting
        # for it (bounded) means the store gains nothing once the collector has closed. What a
        # batch still running after that uses is left to it, and it closes it when it ends
        # (collect_batch): closed from here, an AsyncVectorEnv mid-call would have two threads
        # reading its pipes, and a single env could be freed mid-step.
        self.closed = True
        deadline = time.monotonic() + TEARDOWN_WAIT_S
        while (any(lock.locked() for lock in list(self._stream_locks.values()))
               and time.monotonic() < deadline):
            await asyncio.sleep(0.01)
        self.close_idle()

    def close_idle(self) -> None:
        """After teardown: close each stream's envs that no batch holds, and the weights
        once no batch holds the policy. Called by teardown, then by each batch that ends after
        it (it sees :attr:`closed` once it has let go of its locks, so one of the two closes
        what the batch held)."""
        for stream in list(self.envsets):
            lock = self.stream_lock(stream)
            if lock.acquire(blocking=False):
                try:
                    self.drop_envset(stream)
                finally:
                    lock.release()
        if self.lock.acquire(blocking=False):
            try:
                self.weights.close()
                self.policy = self.store = None
            finally:
                self.lock.release()

    # -- state used by tasks -----------------------------------------------------------------
    def ready_policy(self, version: int, weights: WeightsRef,
                     fallback: bool = True) -> torch.nn.Module:
        """The policy with weights ``version`` on this worker's device (loaded on change;
        call with :attr:`lock` held). See :meth:`WeightsCache.load` for ``fallback``."""
        if self.device is None:
            self.device = resolve_device(self.device_setting, self.worker_name, self.worker_address)
        if self.policy is None:
            self.policy = self.policy_spec.build(self.device)
        if self.version != version:
            self.version = None  # a failed load may leave a mix: no version is loaded
            self.weights.load(self.policy, version, weights, fallback)
            self.version = version
            self.weight_loads += 1
        return self.policy

    @property
    def env(self) -> EnvSpec:
        """The first env (the only one, unless the collection has several)."""
        return self.envs[0]

    def envset(self, stream: int, previous_batch_id: int | None, batch_id: int,
               attempt: int = 0, env: int = 0) -> EnvSet:
        """The stream's envs, continuing from its previous batch where this worker has them.

        Envs left behind by a batch that is not the stream's previous one (the stream ran
        elsewhere meanwhile) are stale: they are replaced, seeded from this batch's id so that
        no episode is repeated (so are a resumed run's first envs). ``env``: the env index the
        stream collects.
        """
        envset = self.envsets.get(stream)
        if envset is not None and envset.last_batch_id != previous_batch_id:
            envset.close()
            envset = None
        if envset is None:
            fresh = previous_batch_id is None and attempt == 0 and not self.resumed
            restart = () if fresh else (batch_id, attempt)
            envset = EnvSet(self.envs[env], self.config.envs_per_worker, self.config.seed,
                            stream, restart, info_keys=self.config.info_keys,
                            store_policy_state=self.config.store_policy_state)
            self.envsets[stream] = envset
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
            except Exception:  # a broken env may fail to close too; the worker runs on
                logger.warning("closing the envs of stream %d failed on %s", stream,
                               self.worker_address, exc_info=True)

    def get_store(self) -> TrajectoryStore:
        """The store, opened for writing on first use."""
        if self.store is None:
            self.store = TrajectoryStore(self.store_url, self.storage_options, read_only=False)
        return self.store


def collector_plugin(worker: Worker, name: str) -> CollectorPlugin:
    """The plugin of collector ``name`` on ``worker``."""
    plugin = worker.plugins.get(name)
    if not isinstance(plugin, CollectorPlugin):
        raise CollectorClosedError(
            f"worker {worker.address} has no daskrl plugin {name!r}: its collector was closed, "
            "or the plugin failed to install on this worker (see the worker's log)."
        )
    return plugin
