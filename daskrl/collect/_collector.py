"""The learner side: :class:`Collector` ships weights, schedules batches and hands over handles."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import os
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from distributed import Client, Future, LocalCluster, as_completed, wait

from daskrl.collect._stats import CollectionStats
from daskrl.config import CollectorConfig, Compression, check_mapping, check_seconds
from daskrl.deploy._cluster import local_cluster
from daskrl.deploy._package_versions import acheck_versions, check_versions
from daskrl.errors import (
    ClusterTimeoutError,
    CollectorClosedError,
    ConfigError,
    DaskrlError,
    PolicyError,
    StoreError,
    WeightsNotSharedError,
)
from daskrl.store._handles import BatchHandle
from daskrl.store._store import (
    BATCH_IDS_PER_RUN,
    TrajectoryStore,
    check_store_options,
    normalize_url,
)
from daskrl.weights._shm import SegmentPool, SharedWeights
from daskrl.weights._snapshot import (
    PolicyLike,
    WeightsSnapshot,
    policy_spec,
    resolve_policy,
    snapshot,
    weights_layout,
)
from daskrl.worker._devices import DeviceSetting, check_device_setting
from daskrl.worker._envs import EnvLike, EnvSpec, check_env_vars
from daskrl.worker._plugin import (
    IN_PROCESS_WEIGHTS,
    BatchTask,
    CollectorPlugin,
    WeightsRef,
    collect_batch,
    preload_shared_weights,
    preload_weights,
    probe_store,
    weights_name,
)
from daskrl.worker._rollout import check_action, check_extras, split_policy_output

__all__ = ["Collector"]

logger = logging.getLogger(__name__)


def _policy_device(module: torch.nn.Module) -> torch.device:
    for t in itertools.chain(module.parameters(), module.buffers()):
        return t.device
    return torch.device("cpu")


def _check_policy_output(
    module: torch.nn.Module, env: EnvSpec, obs_space: Any, act_space: Any, n_envs: int
) -> None:
    """Run the learner's policy on ``n_envs`` sample observations; check the action fits and
    the extra outputs can be stored (names, envs first), before any worker runs it."""
    obs = np.stack([obs_space.sample() for _ in range(n_envs)])
    try:
        with torch.inference_mode():
            out = module(torch.as_tensor(obs, device=_policy_device(module)))
    except Exception as e:
        raise PolicyError(
            f"the policy raised on a batch of {n_envs} sample observations of env {env.name} "
            f"(tensor {tuple(obs.shape)} {obs.dtype}): {type(e).__name__}: {e}"
        ) from e
    action, extras = split_policy_output(out)
    check_action(action, act_space, n_envs, env.name)
    check_extras(extras, n_envs)


class Collector:
    """Collect experience from gymnasium envs on Dask workers into a zarr store.

    The options after ``client`` are those of :class:`~daskrl.config.CollectorConfig`, plus
    ``device`` (per-worker policy device: ``"auto"``, a device, or ``{worker name: device}``),
    ``env_kwargs`` (for ``gymnasium.make``) and ``env_vars`` (set on every worker before its envs
    are built).

    Parameters
    ----------
    env
        A gymnasium id, or a zero-argument factory returning a ``gymnasium.Env``.
    policy
        A ``torch.nn.Module`` mapping an observation tensor ``[E, *obs]`` to an action tensor
        ``[E, *act]`` or to a dict ``{"action": ..., <extra per-step outputs>}``; or a
        zero-argument factory building one.
    store
        Where batches go: a local path or any fsspec URL (``file://``, ``s3://``, ``memory://``).
    storage_options
        Passed to fsspec (credentials, endpoint...). Sent to workers, never stored in handles.
    client
        A ``distributed.Client``; ``None`` starts an embedded ``LocalCluster`` sized to this
        machine, closed with the collector.
    shared_memory
        Workers on the learner's machine read each weights version from one copy in shared
        memory (checksummed; only a small manifest goes through Dask) instead of receiving it
        over a socket. Workers elsewhere make the collector fall back to Dask transfers, as
        does ``False``. (Always Dask transfers with an asynchronous client, and on Windows.)
    call_timeout
        Seconds any one call to the cluster on the learner's path may take (publishing or
        loading weights, probing the store, asking the scheduler); also how long a worker may
        stay silent (no heartbeat reaching the scheduler) before the collector stops using
        it: its batches are submitted again elsewhere. A worker cut off by the network thus
        costs at most about this long, plus the batch collected again; see
        ``docs/deploy/any-cluster.md``.

    Examples
    --------
    >>> with Collector("CartPole-v1", policy, "runs/demo", total_frames=8192) as collector:
    ...     for handle in collector:
    ...         batch = handle.load(device="cpu")
    ...         collector.update_weights(policy)

    With an asynchronous ``Client`` (``Client(..., asynchronous=True)``), start it with
    ``await`` or ``async with``; then ``update_weights`` and ``close`` return awaitables,
    ``submit()`` futures are awaited, and ``async for`` iterates:

    >>> async with Collector(env, policy, url, client=async_client) as collector:
    ...     handle = collector.hand_over(await collector.submit())
    ...     await collector.update_weights(policy)
    ...     async for handle in collector:
    ...         ...
    """

    def __init__(
        self,
        env: EnvLike,
        policy: PolicyLike,
        store: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        client: Client | None = None,
        envs_per_worker: int = 8,
        frames_per_batch: int = 4096,
        total_frames: int | None = 200_000,
        max_frames_per_traj: int | None = None,
        init_random_frames: int = 0,
        reset_at_each_iter: bool = False,
        sync: bool = True,
        device: DeviceSetting = "auto",
        env_kwargs: Mapping[str, Any] | None = None,
        env_vars: Mapping[str, Any] | None = None,
        seed: int = 0,
        num_workers: int | None = None,
        batches_in_flight: int = 2,
        lost_workers_timeout: float = 60.0,
        call_timeout: float = 30.0,
        batch_timeout: float | None = None,
        on_env_error: str = "raise",
        max_env_restarts: int = 3,
        compression: Compression | str = Compression.ZSTD,
        max_policy_lag: int | None = None,
        shared_memory: bool = True,
    ) -> None:
        self._closed = True  # until fully started, close() has nothing to do
        # 1. Everything that can be checked on the learner, before any worker spends time.
        self.config = CollectorConfig(
            envs_per_worker=envs_per_worker,
            frames_per_batch=frames_per_batch,
            total_frames=total_frames,
            max_frames_per_traj=max_frames_per_traj,
            init_random_frames=init_random_frames,
            reset_at_each_iter=reset_at_each_iter,
            sync=sync,
            seed=seed,
            num_workers=num_workers,
            batches_in_flight=batches_in_flight,
            batch_timeout=batch_timeout,
            on_env_error=on_env_error,
            max_env_restarts=max_env_restarts,
            compression=compression,  # type: ignore[arg-type]
            max_policy_lag=max_policy_lag,
        )
        if frames_per_batch >= 1 << 24:
            raise ConfigError(f"frames_per_batch must be below {1 << 24}, got {frames_per_batch}.")
        self._device = check_device_setting(device)
        check_seconds("lost_workers_timeout", lost_workers_timeout)
        self.lost_workers_timeout = float(lost_workers_timeout)
        check_seconds("call_timeout", call_timeout)
        self.call_timeout = float(call_timeout)
        store_url = normalize_url(store)  # a bad store fails now, before the env is probed
        check_store_options(store_url, storage_options)
        if not isinstance(shared_memory, bool):
            raise ConfigError(f"shared_memory must be True or False, got {shared_memory!r}.")
        self._env_vars = check_env_vars(check_mapping("env_vars", env_vars))
        self.env_spec = EnvSpec(env, check_mapping("env_kwargs", env_kwargs), max_frames_per_traj)
        self.observation_space, self.action_space = self.env_spec.probe()
        module, factory = resolve_policy(policy)
        _check_policy_output(
            module, self.env_spec, self.observation_space, self.action_space, envs_per_worker
        )
        self._policy_spec = policy_spec(module, factory)
        self._store = TrajectoryStore(store, storage_options, read_only=False)
        self._store.initialize()
        self._store.next_run()  # a store with no run number left fails now
        self.run = -1  # the run number in the store: registered last, once started

        # 2. The cluster.
        self._own_cluster: LocalCluster | None = None
        if client is None:
            client = self._start_cluster()
        elif not isinstance(client, Client):
            raise ConfigError(f"client must be a distributed.Client or None, got {client!r}.")
        self.client: Client = client
        self._id = uuid.uuid4().hex[:10]
        self._plugin_name = f"daskrl-{self._id}"
        self._closed = False
        self._weights: dict[int, Future] = {}  # versions in use published through Dask
        self._pending: dict[Future, BatchTask] = {}  # submitted, not yet handed over
        # Weights versions in shared memory for workers on this machine (see weights_shm);
        # POSIX only: Windows cannot remove a file that a worker still maps.
        self._segments = SegmentPool(
            enabled=shared_memory and os.name == "posix" and not self.client.asynchronous)
        self._finalizer = weakref.finalize(
            self, Collector._cleanup, self.client, self._own_cluster, self._plugin_name,
            self._pending, self._weights, self._segments, self.call_timeout,
        )
        self._ready = False  # plugin registered, first weights published
        self._module: torch.nn.Module | None = None
        if self.client.asynchronous:
            self._module = module  # started by ``await collector`` / ``async with collector``
            return
        try:
            check_versions(self.client)  # same torch, gymnasium, zarr, daskrl... everywhere
            self._start(module)
        except BaseException:
            self.close()
            raise

    # -- start-up ------------------------------------------------------------------------------
    def _start_cluster(self) -> Client:
        in_process = self._store.url.startswith("memory://")  # workers must share the memory
        cluster = local_cluster(self.config.num_workers, processes=not in_process)
        self._own_cluster = cluster
        return Client(cluster, set_as_default=False)

    def _plugin(self) -> CollectorPlugin:
        return CollectorPlugin(
            self._plugin_name,
            self.env_spec,
            self._policy_spec,
            self.config,
            self._device,
            self._env_vars,
            self._store.url,
            self._store.storage_options,
        )

    def _start(self, module: torch.nn.Module) -> None:
        self.client.register_plugin(self._plugin(), name=self._plugin_name)
        workers = sorted(self.client.scheduler_info()["workers"])
        if not workers:
            self.client.wait_for_workers(1, timeout=120)
            workers = sorted(self.client.scheduler_info()["workers"])
        self._init_state(workers)
        self._probe_store(workers)
        # Every worker builds the policy, picks its device and loads version 0 now, so a bad
        # device, policy or weights path fails here rather than in the first batch.
        self.update_weights(module, wait=True)
        self._register_run()

    def _register_run(self) -> None:
        """Claim a run number, last: a start that fails uses up none."""
        self.run = self._store.register_run({"env": self.env_spec.label,
                                             **self.config.as_dict()})

    def _init_state(self, workers: list[str]) -> None:
        self.num_streams = self.config.num_workers or len(workers)
        self._stream_workers = [workers[s % len(workers)] for s in range(self.num_streams)]
        self._version = -1
        self._snapshots: dict[int, WeightsSnapshot] = {}  # every published version
        self._spare: WeightsSnapshot | None = None  # arrays of a released version, to reuse
        self._layout: tuple[Any, ...] | None = None  # names, dtypes and shapes of the weights
        self._placement: dict[Future, tuple[str, int]] = {}  # worker pinned to, attempt
        self._live: set[str] = set(workers)
        self._live_checked = time.monotonic()
        # Workers cut off from the cluster (silent, or a call to them timed out): no batch
        # or weights go to them until the scheduler forgets them.
        # worker -> its last heartbeat when dropped: heard from again, it is used again.
        self._unresponsive: dict[str, Any] = {}
        self._heard: dict[str, tuple[Any, float]] = {}  # worker -> (last_seen, when it moved)
        self._seed_turn = 0
        self._schedule = self.config.batch_frames()
        self._frames_submitted = 0
        self._next_index = 0
        self._next_stream = 0
        self._stream_last: dict[int, int] = {}  # stream -> id of its latest submitted batch
        self._exhausted = False
        self._requeue: collections.deque[int] = collections.deque()  # frames to collect again
        self._stats = CollectionStats()
        self._ready = True

    def _probe_store(self, workers: list[str]) -> None:
        """Every worker must see and write the learner's store: the classic failure is a local
        path on a cluster of several machines, where each worker writes its own directory."""
        token = uuid.uuid4().hex
        self._store.write_probe(self._id, "learner", token)
        try:
            futures = {
                w: self.client.submit(probe_store, self._plugin_name, self._id, token,
                                      workers=[w], key=f"daskrl-probe-{self._id}-{w}",
                                      pure=False)
                for w in workers
            }
            for fut in self._wait_each(futures, "probing the store").values():
                self._check_probe(fut.result(), token)
        finally:
            self._store.clear_probes(self._id)

    def _wait_each(self, futures: dict[str, Future], what: str) -> dict[str, Future]:
        """Wait up to ``call_timeout`` for one task per worker; raise the first task error.

        Return the finished ones. A worker whose task did not finish is dropped from the plan
        if it is also silent (cut off); a busy worker is only logged. None finished at all:
        :class:`ClusterTimeoutError`.
        """
        with self.client.as_current():
            try:
                wait(list(futures.values()), timeout=self.call_timeout)
            except (TimeoutError, asyncio.TimeoutError):
                pass
        done: dict[str, Future] = {}
        for w, fut in futures.items():
            if fut.status == "error":
                fut.result()  # raises the worker's error, with its traceback
            if fut.status == "finished":
                done[w] = fut
            else:
                fut.cancel()
                self._live_workers(refresh=True)
                if self._silent(w) or w not in self._live:
                    self._drop_worker(w, f"{what} took over {self.call_timeout:g}s")
                else:
                    logger.warning("worker %s did not finish %s within %gs (busy); going on "
                                   "without it", w, what, self.call_timeout)
        if futures and not done:
            raise ClusterTimeoutError(
                f"no worker finished {what} within call_timeout={self.call_timeout:g}s "
                f"(workers: {sorted(futures)}). Check that the workers can reach the "
                "scheduler and each other, or raise call_timeout."
            )
        return done

    def _check_probe(self, address: str, token: str) -> None:
        if self._store.read_probe(self._id, address) != token:
            raise StoreError(
                f"the learner does not see what worker {address} wrote to the store "
                f"{self._store.url!r}. A local path is not shared between machines: use a "
                "shared filesystem mounted at the same path everywhere, or an object store URL."
            )

    # -- weights -------------------------------------------------------------------------------
    def update_weights(self, policy: torch.nn.Module, *, wait: bool = False) -> int:
        """Publish ``policy``'s current weights as a new version; return its number.

        The weights are copied now, so the learner may change them in place right after.
        Batches submitted from now on use this version. Each worker fetches a version once,
        when its first batch on that version starts; ``wait=True`` instead pushes it to every
        worker now and returns once all have verified and loaded it. Batches already
        in flight keep theirs (nothing waits for them to finish). With an asynchronous client
        this returns an awaitable of the version: ``await collector.update_weights(policy)``
        (await each update before the next).
        """
        self._check_open()
        if not isinstance(policy, torch.nn.Module):
            raise PolicyError(
                f"update_weights expects a torch.nn.Module, got {type(policy).__name__}."
            )
        version = self._version + 1
        layout = weights_layout(policy)
        if self._layout is not None and layout != self._layout:
            raise PolicyError(
                "update_weights got a policy whose parameters/buffers differ from the one "
                "the collector started with (names, dtypes or shapes changed). Make a new "
                "Collector for a new architecture."
            )
        self._layout = layout
        snap = self._take_snapshot(policy, version, layout)
        IN_PROCESS_WEIGHTS[self._weights_name(version)] = snap
        if self.client.asynchronous:
            return self._apublish(snap, wait)  # type: ignore[return-value]
        if self._segments.manifest(version) is None:  # else tasks carry the manifest
            self._weights[version] = self._publish(snap)
        self._snapshots[version] = snap
        self._version = version
        self._release_old_weights()
        if wait:
            self._preload(version)
        return version

    def _take_snapshot(self, policy: torch.nn.Module, version: int,
                       layout: tuple[Any, ...]) -> WeightsSnapshot:
        """Copy the weights now: into a shared-memory segment when workers read them there,
        else into the arrays of a released version (or new ones)."""
        spare, self._spare = self._spare, None
        shared = self._segments.write(policy, version, layout)
        if shared is not None:
            return shared[0]
        return snapshot(policy, version, out=dict(zip(spare.names, spare.arrays)) if spare else None)

    @property
    def weights_transport(self) -> str:
        """How weights reach workers now: ``"shared-memory"`` (workers on this machine read
        one copy in place) or ``"dask"`` (each worker receives a copy over the network)."""
        return "dask" if self._version in self._weights else "shared-memory"

    def _preload(self, version: int) -> None:
        """Load ``version`` on every worker now; a worker that cannot read shared memory
        switches the collector to Dask transfers, and the load is done again that way."""
        weights = self._weights_ref(version)
        if isinstance(weights, SharedWeights):
            try:
                results = self._call("loading weights from shared memory", self.client.run,
                                     preload_shared_weights, self._plugin_name, version,
                                     weights, workers=sorted(self._live_workers(refresh=True)),
                                     on_error="return")
            except ClusterTimeoutError as e:  # a worker did not answer: tasks, one by one
                logger.warning("%s; loading version %d with tasks instead", e, version)
                results = {}
            errors = [r for r in results.values() if isinstance(r, BaseException)]
            if results and not errors:
                return
            if not all(isinstance(e, WeightsNotSharedError) for e in errors):
                raise next(e for e in errors if not isinstance(e, WeightsNotSharedError))
            if errors:
                self._stop_sharing_weights(errors[0])
            weights = self._weights_ref(version)
        futures = {
            w: self.client.submit(preload_weights, self._plugin_name, version, weights,
                                  key=f"daskrl-preload-{self._id}-{version}-{w}",
                                  workers=[w], pure=False)
            for w in sorted(self._live_workers(refresh=True))
        }
        self._wait_each(futures, f"loading weights version {version}")

    def _stop_sharing_weights(self, reason: BaseException) -> None:
        """A worker cannot read the shared-memory weights: send every version through Dask."""
        self._segments.enabled = False
        unpublished = [v for v in self._snapshots if v not in self._weights]
        if unpublished:
            logger.warning("weights now go to workers through Dask: %s", reason)
        for version in unpublished:
            self._weights[version] = self._publish(self._snapshots[version])

    def _weights_name(self, version: int) -> str:
        return weights_name(self._plugin_name, version)

    def _publish(self, snap: WeightsSnapshot) -> Future:
        """Send ``snap`` to one responsive worker, the version's seed, and publish it by name:
        every other worker fetches it from there when its first batch on that version starts
        (the learner sends one copy per version, however many hosts). A seed that does not
        take it within ``call_timeout`` is dropped from the plan and the next one tried."""
        name = self._weights_name(snap.version)
        for seed in self._seeds():
            async def send(seed: str = seed) -> list[Future]:
                # A list, so scatter makes one future of the whole snapshot. (Scatter's own
                # timeout bounds only the search for workers: the deadline is _call's.)
                return await self.client.scatter([snap], workers=[seed], hash=False,
                                                 timeout=self.call_timeout, asynchronous=True)

            try:
                [future] = self._call(f"sending weights version {snap.version} to {seed}",
                                      self.client.sync, send)
            except (TimeoutError, asyncio.TimeoutError, OSError) as e:
                self._drop_worker(seed, f"sending weights version {snap.version} failed "
                                        f"({type(e).__name__}: {e})")
                continue
            self._call(f"publishing weights version {snap.version}",
                       self.client.publish_dataset, future, name=name, override=True)
            return future
        raise ClusterTimeoutError(
            f"weights version {snap.version} could not be sent to any worker within "
            f"call_timeout={self.call_timeout:g}s each. Check that the workers can reach the "
            "learner and the scheduler."
        )

    def _seeds(self) -> list[str]:
        """Responsive workers, in the order to try them as the seed of a version (turns)."""
        live = sorted(self._live_workers(refresh=True))
        self._seed_turn += 1
        k = self._seed_turn % len(live) if live else 0
        return live[k:] + live[:k]

    def _call(self, what: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)`` of the (synchronous) client, within ``call_timeout``."""
        try:
            return method(*args, callback_timeout=self.call_timeout, **kwargs)
        except (TimeoutError, asyncio.TimeoutError) as e:
            raise self._timeout_error(what) from e

    def _timeout_error(self, what: str) -> ClusterTimeoutError:
        return ClusterTimeoutError(
            f"{what} did not complete within call_timeout={self.call_timeout:g}s: the "
            "scheduler or a worker does not answer. Check the network between the learner, "
            "the scheduler and the workers, or raise call_timeout."
        )

    def _silent(self, worker: str) -> bool:
        """Whether the scheduler has had no heartbeat from ``worker`` for ``call_timeout``."""
        heard = self._heard.get(worker)
        return heard is not None and time.monotonic() - heard[1] > self.call_timeout

    def _drop_worker(self, worker: str, why: str) -> None:
        """Stop using ``worker`` (cut off): its streams and waiting batches move elsewhere."""
        if worker not in self._unresponsive:
            logger.warning("worker %s is not responding (%s); collecting without it",
                           worker, why)
            self._unresponsive[worker] = self._heard.get(worker, (None,))[0]
        self._live.discard(worker)

    def _unpublish(self, version: int) -> None:
        fut = self._weights.pop(version, None)
        self._spare = self._snapshots.pop(version, None)
        self._segments.release(version)
        IN_PROCESS_WEIGHTS.pop(self._weights_name(version), None)
        if fut is None:
            return
        try:
            self._call("unpublishing weights", self.client.unpublish_dataset,
                       self._weights_name(version))
        except (KeyError, ClusterTimeoutError, OSError):
            logger.debug("could not unpublish weights version %d", version, exc_info=True)
        fut.release()

    @property
    def weights_version(self) -> int:
        """The newest published weights version."""
        return self._version

    def _release_old_weights(self) -> None:
        in_use = {t.weights_version for t in self._pending.values()} | {self._version}
        for v in [v for v in self._snapshots if v not in in_use]:
            self._unpublish(v)

    def _weights_ref(self, version: int | None = None) -> WeightsRef:
        """How a task finds ``version`` (default: the newest): the manifest of its
        shared-memory copy, or the data key it was scattered under (again, if lost)."""
        version = self._version if version is None else version
        if version not in self._weights:
            manifest = self._segments.manifest(version)
            assert manifest is not None
            return manifest
        self._republish_lost_weights()
        return str(self._weights[version].key)

    # -- scheduling ----------------------------------------------------------------------------
    def _submit_next(self, stream: int | None = None) -> Future | None:
        if self._requeue:  # frames of batches dropped as too stale come first
            frames = self._requeue.popleft()
        else:
            if self._exhausted:
                return None
            frames = next(self._schedule, None)
            if frames is None:
                self._exhausted = True
                return None
        if stream is None:
            stream = self._next_stream
            self._next_stream = (self._next_stream + 1) % self.num_streams
        E = self.config.envs_per_worker
        steps = frames // E
        batch_id = self.run * BATCH_IDS_PER_RUN + self._next_index
        task = BatchTask(
            batch_id=batch_id,
            stream=stream,
            previous_batch_id=self._stream_last.get(stream),
            steps=steps,
            random_steps=self.config.random_steps(self._frames_submitted, steps),
            weights_version=self._version,
            weights=self._weights_ref(),
        )
        self._next_index += 1
        self._stream_last[stream] = batch_id
        self._frames_submitted += frames
        return self._dispatch(task)

    def _dispatch(self, task: BatchTask, attempt: int = 0) -> Future:
        """Submit ``task`` to its stream's worker (loosely: Dask may run it elsewhere)."""
        suffix = f"-r{attempt}" if attempt else ""
        worker = self._stream_worker(task.stream)
        fut = self.client.submit(
            collect_batch,
            self._plugin_name,
            task,
            key=f"daskrl-collect-{self._id}-{task.batch_id}{suffix}",
            workers=[worker],
            allow_other_workers=True,
            pure=False,
        )
        self._pending[fut] = task
        self._placement[fut] = (worker, attempt)
        return fut

    def _live_workers(self, refresh: bool = False) -> set[str]:
        now = time.monotonic()
        if refresh or now - self._live_checked > 1.0:
            info = self._call("asking the scheduler for its workers", self.client.sync,
                              self.client.scheduler.identity, n_workers=-1)
            workers = info.get("workers", {})
            for w, ws in workers.items():
                seen = ws.get("last_seen")
                if self._heard.get(w, (None,))[0] != seen:
                    self._heard[w] = (seen, now)
            for w in set(self._heard) - set(workers):
                del self._heard[w]
            for w in list(self._unresponsive):
                # Gone from the scheduler, or heard from again (it was only busy): forgotten.
                if w not in workers or workers[w].get("last_seen") != self._unresponsive[w]:
                    del self._unresponsive[w]
            for w in workers:
                if self._silent(w) and w not in self._unresponsive:
                    self._drop_worker(w, f"no heartbeat for over {self.call_timeout:g}s")
            self._live = set(workers) - set(self._unresponsive)
            self._live_checked = now
        return self._live

    def _stream_worker(self, stream: int) -> str:
        """The worker a stream's batches go to: its envs live there. A stream whose worker
        left moves to the live worker with the fewest streams."""
        live = self._live_workers()
        current = self._stream_workers[stream]
        if not live:
            return current
        load = dict.fromkeys(live, 0)
        for s, w in enumerate(self._stream_workers):
            if w in load and s != stream:
                load[w] += 1
        idle = min(live, key=lambda w: (load[w], w))
        # A stream leaves a departed worker, or one with two streams more than another
        # (a replacement joined): its envs start afresh there, at a batch boundary.
        if current not in live or load[current] > load[idle]:
            self._stream_workers[stream] = idle
        return self._stream_workers[stream]

    def _hand_over(self, task: BatchTask, handle: BatchHandle) -> BatchHandle | None:
        """Hand over an iterator's batch; None if it is too stale (its frames are requeued)."""
        lag = self._version - handle.weights_version
        limit = self.config.max_policy_lag
        if limit is not None and lag > limit:
            self._stats.drop(handle)
            self._requeue.append(handle.frames)
            logger.debug("batch %d dropped: policy lag %d > max_policy_lag=%d",
                         handle.batch_id, lag, limit)
            return None
        handle = _with_lag(handle, lag)
        self._stats.record(handle)
        return handle

    def hand_over(self, handle: BatchHandle | Future) -> BatchHandle:
        """Take over the handle of a batch from :meth:`submit`; return it with its policy lag.

        The handle a ``submit()`` future resolves to has ``policy_lag=0``: the lag is only
        known when the learner takes the batch. ``hand_over`` sets it (the newest weights
        version now minus the batch's ``weights_version``), counts the batch in
        :meth:`summary` and lets the collector forget the future. Pass the handle (or, with a
        synchronous client, the future itself). ``max_policy_lag`` does not apply here: the
        learner sees the lag and decides. Handles yielded by iterating are handed over already.
        """
        self._check_open()
        if isinstance(handle, Future):
            if self.client.asynchronous:
                raise DaskrlError(
                    "hand_over got a Future, but this collector's client is asynchronous: "
                    "pass the handle instead, collector.hand_over(await future)."
                )
            fut: Future | None = handle
            handle = handle.result()
        else:
            fut = next((f for f, t in self._pending.items() if t.batch_id == handle.batch_id),
                       None)
        if not isinstance(handle, BatchHandle) or fut not in self._pending:
            what = handle.batch_id if isinstance(handle, BatchHandle) else repr(handle)
            raise DaskrlError(
                f"hand_over got batch {what}, which is not a batch of this collector waiting to "
                "be handed over: pass each handle of a submit() future once; handles from "
                "iterating the collector are handed over already."
            )
        self._pending.pop(fut)
        handle = _with_lag(handle, self._version - handle.weights_version)
        self._stats.record(handle)
        return handle

    @property
    def in_flight(self) -> int:
        """Batches submitted and not yet handed over (queued, running, or done and waiting)."""
        return len(self._pending) if self._ready else 0

    def submit(self) -> Future:
        """Submit the next batch now; return a ``distributed.Future`` of its handle.

        The future works with ``distributed.wait``, ``as_completed`` (inside
        ``with collector.client.as_current():`` unless it is the default client) and ``await``
        (with an asynchronous client). Pass its handle to :meth:`hand_over` to get its
        ``policy_lag`` and count it in :meth:`summary`. Cancelling the future
        (``future.cancel()``) before its batch starts leaves nothing in the store; cancelling
        it while the batch runs stops the batch before its write, unless the write has begun
        (then the batch is committed like any other). A cancelled batch's frames are not
        collected again.
        """
        self._check_open()
        fut = self._submit_next()
        if fut is None:
            raise CollectorClosedError(
                f"total_frames={self.config.total_frames} are all submitted; no batch is left."
            )
        # The caller owns this future: it is not re-dispatched by an iterator; hand_over()
        # takes it off the books.
        self._placement.pop(fut, None)
        return fut

    def __iter__(self) -> Iterator[BatchHandle]:
        self._check_open()
        return self._iter_sync() if self.config.sync else self._iter_async()

    def _as_completed(self, futures: list[Future]) -> as_completed:
        return as_completed(futures, loop=self.client.loop, with_results=True,
                            raise_errors=False)

    def _iter_sync(self) -> Iterator[BatchHandle]:
        while True:
            round_ = [f for f in (self._submit_next(s) for s in range(self.num_streams)) if f]
            if not round_:
                return
            # Results are fetched as tasks finish, and handed over in batch order.
            order = [self._pending[f].batch_id for f in round_]
            ac = self._as_completed(round_)
            # Hold no future of a batch handed over: Dask would compute it again if the worker
            # holding its result died.
            del round_
            done: dict[int, tuple[Future, BatchHandle]] = {}
            for batch_id in order:
                while batch_id not in done:
                    fut, result = self._next_done(ac)
                    done[self._pending[fut].batch_id] = (fut, result)
                fut, result = done.pop(batch_id)
                handle = self._hand_over(self._pending.pop(fut), result)
                del fut, result
                if handle is not None:  # else dropped as too stale: recollected next round
                    yield handle

    def _iter_async(self) -> Iterator[BatchHandle]:
        ac = self._as_completed([])
        refill = [s for _ in range(self.config.batches_in_flight) for s in range(self.num_streams)]
        while True:
            # A stream's next batch is submitted when the learner comes back for a handle, so
            # it gets the weights the learner published meanwhile; the stream's other batches
            # in flight keep its worker busy in the meantime.
            for fut in filter(None, map(self._submit_next, refill)):
                ac.add(fut)
            if ac.is_empty():
                return
            fut, result = self._next_done(ac)
            task = self._pending.pop(fut)
            refill = [task.stream]
            handle = self._hand_over(task, result)
            del fut, result  # see _iter_sync
            if handle is not None:  # else dropped as too stale: its frames are requeued
                yield handle

    def _next_done(self, ac: as_completed) -> tuple[Future, BatchHandle]:
        """The next finished batch, keeping the collection healthy meanwhile: lost weights are
        scattered again, batches stranded on a departed worker are sent elsewhere, and a
        cluster without workers for ``lost_workers_timeout`` seconds is an error."""
        no_workers_since: float | None = None
        while True:
            if ac.is_empty():
                raise RuntimeError("daskrl internal error: waiting with no batch in flight")
            if ac.has_ready():
                fut, result = next(ac)
                _, attempt = self._placement.pop(fut, (None, 0))
                if fut not in self._pending:  # a replaced attempt
                    continue
                if fut.status != "finished":
                    error = fut.exception()
                    if isinstance(error, WeightsNotSharedError) and attempt < 3:
                        # A worker off this machine: weights go through Dask, batch again.
                        self._stop_sharing_weights(error)
                        task = self._pending.pop(fut)
                        task = dataclasses.replace(
                            task, weights=self._weights_ref(task.weights_version))
                        ac.add(self._dispatch(task, attempt + 1))
                        continue
                    fut.result()  # raises the worker's error, with its traceback
                return fut, result  # still pending until handed over
            live = self._live_workers(refresh=True)
            if live:
                no_workers_since = None
            elif no_workers_since is None:
                no_workers_since = time.monotonic()
            elif time.monotonic() - no_workers_since > self.lost_workers_timeout:
                raise DaskrlError(
                    f"the cluster has had no workers for {self.lost_workers_timeout:.0f}s "
                    f"({len(self._pending)} batches waiting). Start workers or check the "
                    "cluster, then collect again (batches committed so far are in the store)."
                )
            if live:
                self._republish_lost_weights()
                self._redispatch_stranded(ac, live)
            with ac.thread_condition:
                ac.thread_condition.wait(timeout=0.25)

    def _redispatch_stranded(self, ac: as_completed, live: set[str]) -> None:
        """Resubmit waiting batches pinned to a worker that left. (Dask keeps a task whose
        loose restriction names a departed worker unrunnable when no worker was alive at that
        moment, even after new workers join.)"""
        stranded = [f for f, (w, _) in self._placement.items() if w not in live and not f.done()]
        running = {k: w for w, keys in self._call(
            "asking the scheduler what runs where", self.client.sync,
            self.client.scheduler.processing).items() for k in keys} if (
            stranded or self._unresponsive) else {}
        # A batch running on a worker that was cut off is collected again elsewhere (if the
        # worker comes back and commits it too, the store keeps exactly one of the two).
        stranded += [f for f in self._placement if not f.done() and f not in stranded
                     and running.get(f.key) in self._unresponsive]
        if not stranded:
            return
        for fut in stranded:
            if fut.key in running and running[fut.key] not in self._unresponsive:
                continue
            task = self._pending.pop(fut)
            _, attempt = self._placement.pop(fut)
            fut.cancel()
            logger.warning("batch %d was waiting for a departed worker; submitting it again",
                           task.batch_id)
            ac.add(self._dispatch(task, attempt + 1))

    def _republish_lost_weights(self) -> None:
        """Scattered data dies with its worker: scatter lost versions again from the learner
        (later, on the next health check, if no worker is there to take them now)."""
        lost = [v for v, f in self._weights.items() if f.status in ("lost", "cancelled", "error")]
        if not lost or not self._live_workers(refresh=True):
            return
        for version in lost:
            logger.warning("weights version %d was lost with its worker(s); scattering it "
                           "again", version)
            try:
                self._weights[version] = self._publish(self._snapshots[version])
            except (TimeoutError, OSError):  # the workers left meanwhile: retried later
                logger.debug("scattering weights version %d failed", version, exc_info=True)
                return

    # -- metrics -------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Running totals over the batches handed over to the learner.

        Keys: ``frames``, ``batches``, ``seconds`` (since start), ``fps`` (frames/s handed
        over), ``episodes`` (finished), ``mean_return`` and ``mean_length`` (last 100
        episodes), ``policy_lag_mean``, ``policy_lag_max``, ``policy_lag_counts``
        (``{lag: batches}``), ``dropped_stale`` and ``dropped_frames`` (batches not handed over
        because of ``max_policy_lag``), ``workers`` (per address: ``batches``, ``frames``,
        ``fps`` over the run's wall time, ``rollout_fps`` while stepping, ``write_seconds``),
        ``in_flight``, ``weights_version`` and ``store``.
        """
        if not hasattr(self, "_stats"):  # works after close(), not before the start
            self._check_open()
        return {
            **self._stats.summary(),
            "in_flight": len(self._pending),
            "weights_version": self._version,
            "store": self._store.url,
        }

    @property
    def store(self) -> TrajectoryStore:
        """The store this collector writes to (for reading back)."""
        return self._store

    # -- lifecycle -----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise CollectorClosedError("this collector is closed; create a new one.")
        if not self._ready:
            raise DaskrlError(
                "this collector has an asynchronous client and is not started yet: use "
                "`collector = await Collector(...)` or `async with Collector(...) as collector`."
            )

    def close(self) -> None:
        """Stop outstanding tasks, free worker state, close an embedded cluster.

        With an asynchronous client this returns an awaitable: ``await collector.close()``.
        """
        if getattr(self, "client", None) is not None and self.client.asynchronous:
            return self.aclose()  # type: ignore[return-value]
        if self._closed:
            if getattr(self, "_own_cluster", None) is not None and hasattr(self, "client"):
                self._finalizer()
            return
        self._closed = True
        if self.client.status == "running":
            for v in list(getattr(self, "_snapshots", self._weights)):
                self._unpublish(v)
        getattr(self, "_placement", {}).clear()
        self._finalizer()  # removes the shared-memory segments too

    @staticmethod
    def _cleanup(client: Client, cluster: LocalCluster | None, plugin_name: str,
                 pending: dict[Future, Any], weights: dict[int, Future],
                 segments: SegmentPool, timeout: float = 30.0) -> None:
        """Release what a collector holds on the cluster (also run if it is garbage-collected)."""
        segments.close()
        if client.asynchronous:  # nothing can be awaited here; aclose() does the cleanup
            return
        try:
            if client.status == "running":
                if pending:
                    client.cancel(list(pending))
                    pending.clear()
                for version in list(weights):
                    name = weights_name(plugin_name, version)
                    IN_PROCESS_WEIGHTS.pop(name, None)
                    try:
                        client.unpublish_dataset(name, callback_timeout=timeout)
                    except KeyError:
                        pass
                    weights.pop(version).release()
                # The scheduler tells every worker (a cut-off one too): bounded.
                client.sync(client.scheduler.unregister_worker_plugin, name=plugin_name,
                            callback_timeout=timeout)
        except Exception:  # the cluster may already be gone
            logger.debug("could not release %s", plugin_name, exc_info=True)
        if cluster is not None:
            client.close()
            cluster.close()

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- asynchronous clients ------------------------------------------------------------------
    async def _astart(self) -> Collector:
        if self._ready or self._closed:
            return self
        try:
            await self.client.register_plugin(self._plugin(), name=self._plugin_name)
            info = await self.client.scheduler.identity(n_workers=-1)
            if not info["workers"]:
                await self.client.wait_for_workers(1, timeout=120)
                info = await self.client.scheduler.identity(n_workers=-1)
            workers = sorted(info["workers"])
            await acheck_versions(self.client)
            self._init_state(workers)
            await self._aprobe_store(workers)
            module, self._module = self._module, None
            await self.update_weights(module, wait=True)  # type: ignore[arg-type,misc]
            self._register_run()
        except BaseException:
            await self.aclose()
            raise
        return self

    def __await__(self) -> Generator[Any, None, Collector]:
        return self._astart().__await__()

    async def __aenter__(self) -> Collector:
        return await self._astart()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _apublish(self, snap: WeightsSnapshot, wait: bool = False) -> int:
        """:meth:`update_weights` with an asynchronous client (see :meth:`_publish`)."""
        name = self._weights_name(snap.version)
        t = self.call_timeout
        info = await self._abounded("asking the scheduler for its workers",
                                    self.client.scheduler.identity(n_workers=-1))
        live = sorted(info["workers"])
        self._seed_turn += 1
        k = self._seed_turn % len(live) if live else 0
        for seed in live[k:] + live[:k]:  # one copy, to one responsive worker (see _publish)
            try:
                [future] = await self._abounded(
                    f"sending weights version {snap.version} to {seed}",
                    self.client.scatter([snap], workers=[seed], hash=False, timeout=t))
                break
            except (TimeoutError, asyncio.TimeoutError, OSError) as e:
                logger.warning("worker %s did not take weights version %d (%s: %s)", seed,
                               snap.version, type(e).__name__, e)
        else:
            raise ClusterTimeoutError(
                f"weights version {snap.version} could not be sent to any worker within "
                f"call_timeout={t:g}s each. Check that the workers can reach the learner.")
        await self._abounded(f"publishing weights version {snap.version}",
                             self.client.publish_dataset(future, name=name, override=True))
        self._weights[snap.version] = future
        self._snapshots[snap.version] = snap
        self._version = snap.version
        in_use = {t.weights_version for t in self._pending.values()} | {self._version}
        for v in [v for v in self._weights if v not in in_use]:
            await self._aunpublish(v)
        if wait:
            await self._abounded(f"loading weights version {snap.version}", self.client.gather([
                self.client.submit(preload_weights, self._plugin_name, snap.version,
                                   str(future.key), workers=[w], pure=False,
                                   key=f"daskrl-preload-{self._id}-{snap.version}-{w}")
                for w in info["workers"]
            ]))
        return snap.version

    async def _abounded(self, what: str, awaitable: Any) -> Any:
        """``await awaitable`` within ``call_timeout`` (see :meth:`_call`)."""
        try:
            return await asyncio.wait_for(awaitable, self.call_timeout)
        except (TimeoutError, asyncio.TimeoutError) as e:
            raise self._timeout_error(what) from e

    async def _aprobe_store(self, workers: list[str]) -> None:
        """:meth:`_probe_store` with an asynchronous client."""
        token = uuid.uuid4().hex
        self._store.write_probe(self._id, "learner", token)
        try:
            addresses = await self.client.gather([
                self.client.submit(probe_store, self._plugin_name, self._id, token, workers=[w],
                                   key=f"daskrl-probe-{self._id}-{w}", pure=False)
                for w in workers
            ])
            for address in addresses:
                self._check_probe(address, token)
        finally:
            self._store.clear_probes(self._id)

    async def _aunpublish(self, version: int) -> None:
        fut = self._weights.pop(version)  # with an asynchronous client, all go through Dask
        self._spare = self._snapshots.pop(version, None)
        self._segments.release(version)
        IN_PROCESS_WEIGHTS.pop(self._weights_name(version), None)
        try:
            await self.client.unpublish_dataset(self._weights_name(version))
        except KeyError:
            pass
        fut.release()

    async def aclose(self) -> None:
        """Close (see :meth:`close`) from async code; with any client."""
        if not self.client.asynchronous:
            self.close()
            return
        if self._closed:
            return
        self._closed = True
        pending = list(getattr(self, "_pending", {}))
        if pending:
            await self.client.cancel(pending)
        if self.client.status == "running":
            for v in list(getattr(self, "_weights", {})):
                await self._aunpublish(v)
            try:
                await self.client.unregister_worker_plugin(self._plugin_name)
            except Exception:  # never registered, or the cluster is gone
                logger.debug("could not unregister %s", self._plugin_name, exc_info=True)
        self._weights.clear()
        self._pending.clear()
        self._finalizer.detach()

    def __aiter__(self) -> AsyncIterator[BatchHandle]:
        self._check_open()
        if not self.client.asynchronous:
            raise DaskrlError(
                "`async for` needs a collector with an asynchronous client "
                "(Client(..., asynchronous=True)); with this one, use a plain `for` loop."
            )
        return self._aiter_sync() if self.config.sync else self._aiter_async()

    async def _aiter_sync(self) -> AsyncIterator[BatchHandle]:
        while True:
            round_ = [f for f in (self._submit_next(s) for s in range(self.num_streams)) if f]
            if not round_:
                return
            for fut in round_:
                result = await fut
                self._placement.pop(fut, None)
                handle = self._hand_over(self._pending.pop(fut), result)
                if handle is not None:
                    yield handle

    async def _aiter_async(self) -> AsyncIterator[BatchHandle]:
        ac = as_completed(loop=self.client.loop)
        refill = [s for _ in range(self.config.batches_in_flight) for s in range(self.num_streams)]
        while True:
            for fut in filter(None, map(self._submit_next, refill)):
                ac.add(fut)
            try:
                fut = await ac.__anext__()
            except StopAsyncIteration:
                return
            result = await fut
            self._placement.pop(fut, None)
            task = self._pending.pop(fut)
            refill = [task.stream]
            handle = self._hand_over(task, result)
            if handle is not None:
                yield handle


def _with_lag(handle: BatchHandle, lag: int) -> BatchHandle:
    return dataclasses.replace(handle, policy_lag=lag)
