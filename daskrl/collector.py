"""The learner side: :class:`Collector` ships weights, schedules batches and hands over handles."""

from __future__ import annotations

import itertools
import logging
import math
import time
import uuid
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from distributed import Client, Future, LocalCluster, as_completed

from .cluster import local_cluster
from .config import CollectorConfig, Compression, check_mapping
from .devices import DeviceSetting, check_device_setting
from .envs import EnvLike, EnvSpec, check_env_vars
from .errors import CollectorClosedError, ConfigError, DaskrlError, PolicyError, StoreError
from .handles import BatchHandle
from .rollout import check_action, split_policy_output
from .store import BATCH_IDS_PER_RUN, TrajectoryStore
from .versions import check_versions
from .weights import PolicyLike, WeightsSnapshot, policy_spec, resolve_policy, snapshot
from .worker import (
    IN_PROCESS_WEIGHTS,
    BatchTask,
    CollectorPlugin,
    collect_batch,
    preload_weights,
    probe_store,
)

__all__ = ["Collector"]

logger = logging.getLogger(__name__)


def _policy_device(module: torch.nn.Module) -> torch.device:
    for t in itertools.chain(module.parameters(), module.buffers()):
        return t.device
    return torch.device("cpu")


def _check_policy_output(
    module: torch.nn.Module, env: EnvSpec, obs_space: Any, act_space: Any, n_envs: int
) -> None:
    """Run the learner's policy on ``n_envs`` sample observations; check the action fits."""
    obs = np.stack([obs_space.sample() for _ in range(n_envs)])
    try:
        with torch.inference_mode():
            out = module(torch.as_tensor(obs, device=_policy_device(module)))
    except Exception as e:
        raise PolicyError(
            f"the policy raised on a batch of {n_envs} sample observations of env {env.name} "
            f"(tensor {tuple(obs.shape)} {obs.dtype}): {type(e).__name__}: {e}"
        ) from e
    action, _ = split_policy_output(out)
    check_action(action, act_space, n_envs, env.name)


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

    Examples
    --------
    >>> with Collector("CartPole-v1", policy, "runs/demo", total_frames=8192) as collector:
    ...     for handle in collector:
    ...         batch = handle.load(device="cpu")
    ...         collector.update_weights(policy)
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
        batch_timeout: float | None = None,
        on_env_error: str = "raise",
        max_env_restarts: int = 3,
        compression: Compression | str = Compression.ZSTD,
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
        )
        if frames_per_batch >= 1 << 24:
            raise ConfigError(f"frames_per_batch must be below {1 << 24}, got {frames_per_batch}.")
        self._device = check_device_setting(device)
        if not isinstance(lost_workers_timeout, (int, float)) or lost_workers_timeout <= 0:
            raise ConfigError(
                f"lost_workers_timeout must be a positive number of seconds, got "
                f"{lost_workers_timeout!r}."
            )
        self.lost_workers_timeout = float(lost_workers_timeout)
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
        self.run = self._store.register_run({"env": self.env_spec.label, **self.config.as_dict()})

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
        self._weights: dict[int, Future] = {}  # published versions still in use
        self._pending: dict[Future, BatchTask] = {}  # submitted, not yet handed over
        self._finalizer = weakref.finalize(
            self, Collector._cleanup, self.client, self._own_cluster, self._plugin_name,
            self._pending, self._weights,
        )
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

    def _start(self, module: torch.nn.Module) -> None:
        plugin = CollectorPlugin(
            self._plugin_name,
            self.env_spec,
            self._policy_spec,
            self.config,
            self._device,
            self._env_vars,
            self._store.url,
            self._store.storage_options,
        )
        self.client.register_plugin(plugin, name=self._plugin_name)
        workers = sorted(self.client.scheduler_info()["workers"])
        if not workers:
            self.client.wait_for_workers(1, timeout=120)
            workers = sorted(self.client.scheduler_info()["workers"])
        self.num_streams = self.config.num_workers or len(workers)
        self._stream_workers = [workers[s % len(workers)] for s in range(self.num_streams)]
        self._version = -1
        self._snapshots: dict[int, WeightsSnapshot] = {}  # every published version
        self._spare: WeightsSnapshot | None = None  # arrays of a released version, to reuse
        self._placement: dict[Future, tuple[str, int]] = {}  # worker pinned to, attempt
        self._live: set[str] = set(workers)
        self._live_checked = time.monotonic()
        self._schedule = self.config.batch_frames()
        self._frames_submitted = 0
        self._next_index = 0
        self._next_stream = 0
        self._stream_last: dict[int, int] = {}  # stream -> id of its latest submitted batch
        self._exhausted = False
        self._frames = 0
        self._batches = 0
        self._episodes: list[float] = []
        self._started = time.perf_counter()
        self._probe_store(workers)
        # Every worker builds the policy, picks its device and loads version 0 now, so a bad
        # device, policy or weights path fails here rather than in the first batch.
        self.update_weights(module, wait=True)

    def _probe_store(self, workers: list[str]) -> None:
        """Every worker must see and write the learner's store: the classic failure is a local
        path on a cluster of several machines, where each worker writes its own directory."""
        token = uuid.uuid4().hex
        self._store.write_probe(self.run, "learner", token)
        try:
            futures = [
                self.client.submit(probe_store, self._plugin_name, self.run, token, workers=[w],
                                   key=f"daskrl-probe-{self._id}-{w}", pure=False)
                for w in workers
            ]
            for address in self.client.gather(futures):
                if self._store.read_probe(self.run, address) != token:
                    raise StoreError(
                        f"the learner does not see what worker {address} wrote to the store "
                        f"{self._store.url!r}. A local path is not shared between machines: use "
                        "a shared filesystem mounted at the same path everywhere, or an object "
                        "store URL."
                    )
        finally:
            self._store.clear_probes(self.run)

    # -- weights -------------------------------------------------------------------------------
    def update_weights(self, policy: torch.nn.Module, *, wait: bool = False) -> int:
        """Publish ``policy``'s current weights as a new version; return its number.

        The weights are copied now, so the learner may change them in place right after.
        Batches submitted from now on use this version. Each worker fetches a version once,
        when its first batch on that version starts; ``wait=True`` instead pushes it to every
        worker now and returns once all have verified and loaded it.
        """
        self._check_open()
        if not isinstance(policy, torch.nn.Module):
            raise PolicyError(
                f"update_weights expects a torch.nn.Module, got {type(policy).__name__}."
            )
        version = self._version + 1
        snap = snapshot(policy, version, reuse=self._spare)
        self._spare = None
        if self._snapshots:
            previous = self._snapshots[max(self._snapshots)]
            if _layout(previous) != _layout(snap):
                raise PolicyError(
                    "update_weights got a policy whose parameters/buffers differ from the one "
                    "the collector started with (names, dtypes or shapes changed). Make a new "
                    "Collector for a new architecture."
                )
        self._weights[version] = self._publish(snap)
        self._snapshots[version] = snap
        self._version = version
        self._release_old_weights()
        if wait:
            self._preload(version)
        return version

    def _preload(self, version: int) -> None:
        name, key = self._weights_key()
        workers = list(self.client.scheduler_info()["workers"])
        futures = [
            self.client.submit(preload_weights, self._plugin_name, version, name, key,
                               key=f"daskrl-preload-{self._id}-{version}-{w}", workers=[w],
                               pure=False)
            for w in workers
        ]
        self.client.gather(futures)

    def _weights_name(self, version: int) -> str:
        return f"{self._plugin_name}-weights-v{version}"

    def _publish(self, snap: WeightsSnapshot) -> Future:
        # A list, so scatter makes one future of the whole snapshot. Broadcast: every worker
        # gets its copy now, to load from its own memory; published under a name so that a
        # worker without a copy (a replacement, or after the active memory manager dropped
        # extra replicas) fetches it when its cached version differs.
        name = self._weights_name(snap.version)
        IN_PROCESS_WEIGHTS[name] = snap
        [future] = self.client.scatter([snap], hash=False, broadcast=True)
        self.client.publish_dataset(future, name=name, override=True)
        return future

    def _unpublish(self, version: int) -> None:
        fut = self._weights.pop(version)
        self._spare = self._snapshots.pop(version, None)
        IN_PROCESS_WEIGHTS.pop(self._weights_name(version), None)
        try:
            self.client.unpublish_dataset(self._weights_name(version))
        except KeyError:
            pass
        fut.release()

    @property
    def weights_version(self) -> int:
        """The newest published weights version."""
        return self._version

    def _release_old_weights(self) -> None:
        in_use = {t.weights_version for t in self._pending.values()} | {self._version}
        for v in [v for v in self._weights if v not in in_use]:
            self._unpublish(v)

    def _weights_key(self) -> tuple[str, str]:
        """``(published name, data key)`` of the newest version, scattered again if lost."""
        if self._live_workers():
            self._republish_lost_weights()
        fut = self._weights[self._version]
        return self._weights_name(self._version), str(fut.key)

    # -- scheduling ----------------------------------------------------------------------------
    def _submit_next(self, stream: int | None = None) -> Future | None:
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
            weights=self._weights_key(),
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
            self._live = set(self.client.scheduler_info().get("workers", {}))
            self._live_checked = now
        return self._live

    def _stream_worker(self, stream: int) -> str:
        """The worker a stream's batches go to: its envs live there. A stream whose worker
        left moves to the live worker with the fewest streams."""
        live = self._live_workers()
        current = self._stream_workers[stream]
        if live and current not in live:
            load = dict.fromkeys(live, 0)
            for s, w in enumerate(self._stream_workers):
                if w in load and s != stream:
                    load[w] += 1
            self._stream_workers[stream] = min(live, key=lambda w: (load[w], w))
        return self._stream_workers[stream]

    def _hand_over(self, task: BatchTask, handle: BatchHandle) -> BatchHandle:
        handle = _with_lag(handle, self._version - handle.weights_version)
        self._frames += handle.frames
        self._batches += 1
        self._episodes.extend(handle.episode_returns)
        return handle

    def submit(self) -> Future:
        """Submit the next batch now; return a ``distributed.Future`` of its handle."""
        self._check_open()
        fut = self._submit_next()
        if fut is None:
            raise CollectorClosedError(
                f"total_frames={self.config.total_frames} are all submitted; no batch is left."
            )
        # The caller owns this future: it is neither re-dispatched nor awaited by an iterator.
        self._placement.pop(fut, None)
        fut.add_done_callback(lambda f: self._pending.pop(f, None))
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
            done: dict[int, tuple[BatchTask, BatchHandle]] = {}
            for batch_id in order:
                while batch_id not in done:
                    task, handle = self._next_done(ac)
                    done[task.batch_id] = (task, handle)
                yield self._hand_over(*done.pop(batch_id))

    def _iter_async(self) -> Iterator[BatchHandle]:
        first = [self._submit_next(s) for _ in range(self.config.batches_in_flight)
                 for s in range(self.num_streams)]
        ac = self._as_completed([f for f in first if f])
        while not ac.is_empty():
            task, handle = self._next_done(ac)
            nxt = self._submit_next(task.stream)
            if nxt is not None:
                ac.add(nxt)
            yield self._hand_over(task, handle)

    def _next_done(self, ac: as_completed) -> tuple[BatchTask, BatchHandle]:
        """The next finished batch, keeping the collection healthy meanwhile: lost weights are
        scattered again, batches stranded on a departed worker are sent elsewhere, and a
        cluster without workers for ``lost_workers_timeout`` seconds is an error."""
        no_workers_since: float | None = None
        while True:
            if ac.is_empty():
                raise RuntimeError("daskrl internal error: waiting with no batch in flight")
            if ac.has_ready():
                fut, result = next(ac)
                task = self._pending.pop(fut, None)
                self._placement.pop(fut, None)
                if task is None:  # a replaced attempt
                    continue
                if fut.status != "finished":
                    fut.result()  # raises the worker's error, with its traceback
                return task, result
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
        if not stranded:
            return
        running = {k for keys in self.client.processing().values() for k in keys}
        for fut in stranded:
            if fut.key in running:
                continue
            task = self._pending.pop(fut)
            _, attempt = self._placement.pop(fut)
            fut.cancel()
            logger.warning("batch %d was waiting for a departed worker; submitting it again",
                           task.batch_id)
            ac.add(self._dispatch(task, attempt + 1))

    def _republish_lost_weights(self) -> None:
        """Scattered data dies with its worker: scatter lost versions again from the learner."""
        for version, fut in list(self._weights.items()):
            if fut.status in ("lost", "cancelled", "error"):
                logger.warning("weights version %d was lost with its worker(s); scattering it "
                               "again", version)
                self._weights[version] = self._publish(self._snapshots[version])

    # -- metrics -------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Running totals: frames, batches, frames/s, episodes, mean return (last 100)."""
        elapsed = time.perf_counter() - self._started
        recent = self._episodes[-100:]
        return {
            "frames": self._frames,
            "batches": self._batches,
            "seconds": elapsed,
            "fps": self._frames / elapsed if elapsed > 0 else 0.0,
            "episodes": len(self._episodes),
            "mean_return": float(np.mean(recent)) if recent else math.nan,
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

    def close(self) -> None:
        """Stop outstanding tasks, free worker state, close an embedded cluster."""
        if self._closed:
            if getattr(self, "_own_cluster", None) is not None and hasattr(self, "client"):
                self._finalizer()
            return
        self._closed = True
        if self.client.status == "running":
            for v in list(self._weights):
                self._unpublish(v)
        getattr(self, "_placement", {}).clear()
        self._finalizer()

    @staticmethod
    def _cleanup(client: Client, cluster: LocalCluster | None, plugin_name: str,
                 pending: dict[Future, Any], weights: dict[int, Future]) -> None:
        """Release what a collector holds on the cluster (also run if it is garbage-collected)."""
        try:
            if client.status == "running":
                if pending:
                    client.cancel(list(pending))
                    pending.clear()
                for version in list(weights):
                    IN_PROCESS_WEIGHTS.pop(f"{plugin_name}-weights-v{version}", None)
                    try:
                        client.unpublish_dataset(f"{plugin_name}-weights-v{version}")
                    except KeyError:
                        pass
                    weights.pop(version).release()
                client.unregister_worker_plugin(plugin_name)
        except Exception:  # the cluster may already be gone
            logger.debug("could not release %s", plugin_name, exc_info=True)
        if cluster is not None:
            client.close()
            cluster.close()

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _layout(snap: WeightsSnapshot) -> tuple[Any, ...]:
    return snap.names, snap.dtypes, tuple(a.shape for a in snap.arrays)


def _with_lag(handle: BatchHandle, lag: int) -> BatchHandle:
    import dataclasses

    return dataclasses.replace(handle, policy_lag=lag)
