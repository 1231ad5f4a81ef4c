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
from .errors import CollectorClosedError, ConfigError, PolicyError
from .handles import BatchHandle
from .rollout import check_action, split_policy_output
from .store import BATCH_IDS_PER_RUN, TrajectoryStore
from .versions import check_versions
from .weights import PolicyLike, WeightsSnapshot, policy_spec, resolve_policy, snapshot
from .worker import IN_PROCESS_WEIGHTS, BatchTask, CollectorPlugin, collect_batch

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
            compression=compression,  # type: ignore[arg-type]
        )
        if frames_per_batch >= 1 << 24:
            raise ConfigError(f"frames_per_batch must be below {1 << 24}, got {frames_per_batch}.")
        self._device = check_device_setting(device)
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
        self._finalizer = weakref.finalize(
            self, Collector._cleanup, self.client, self._own_cluster, self._plugin_name
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
        self._weights: dict[int, Future] = {}
        self._snapshots: dict[int, WeightsSnapshot] = {}
        self._pending: dict[Future, BatchTask] = {}
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
        self.update_weights(module)

    # -- weights -------------------------------------------------------------------------------
    def update_weights(self, policy: torch.nn.Module) -> int:
        """Publish ``policy``'s current weights as a new version; return its number.

        The weights are copied now, so the learner may change them in place right after.
        Batches submitted from now on use this version.
        """
        self._check_open()
        if not isinstance(policy, torch.nn.Module):
            raise PolicyError(
                f"update_weights expects a torch.nn.Module, got {type(policy).__name__}."
            )
        version = self._version + 1
        snap = snapshot(policy, version)
        if self._snapshots:
            previous = self._snapshots[max(self._snapshots)]
            if previous.names != snap.names or previous.dtypes != snap.dtypes:
                raise PolicyError(
                    "update_weights got a policy whose parameters/buffers differ from the one "
                    "the collector started with (names or dtypes changed). Make a new Collector "
                    "for a new architecture."
                )
        self._weights[version] = self._publish(snap)
        self._snapshots = {version: snap}
        self._version = version
        self._release_old_weights()
        return version

    def _weights_name(self, version: int) -> str:
        return f"{self._plugin_name}-weights-v{version}"

    def _publish(self, snap: WeightsSnapshot) -> Future:
        # A list, so scatter makes one future of the whole snapshot; published under a name
        # so that a worker fetches it only when its cached version differs.
        name = self._weights_name(snap.version)
        IN_PROCESS_WEIGHTS[name] = snap
        [future] = self.client.scatter([snap], hash=False)
        self.client.publish_dataset(future, name=name, override=True)
        return future

    def _unpublish(self, version: int) -> None:
        fut = self._weights.pop(version)
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

    def _weights_key(self) -> str:
        fut = self._weights[self._version]
        if fut.status in ("lost", "error", "cancelled"):
            logger.warning(
                "weights version %d was lost with its worker; scattering it again", self._version
            )
            self._weights[self._version] = self._publish(self._snapshots[self._version])
        return self._weights_name(self._version)

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
            weights_key=self._weights_key(),
        )
        self._next_index += 1
        self._stream_last[stream] = batch_id
        self._frames_submitted += frames
        fut = self.client.submit(
            collect_batch,
            self._plugin_name,
            task,
            key=f"daskrl-collect-{self._id}-{batch_id}",
            workers=[self._stream_workers[stream]],
            allow_other_workers=True,
            pure=False,
        )
        self._pending[fut] = task
        return fut

    def _hand_over(self, fut: Future, handle: BatchHandle | None = None) -> BatchHandle:
        if handle is None:
            handle = fut.result()
        self._pending.pop(fut, None)
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
        return fut

    def __iter__(self) -> Iterator[BatchHandle]:
        self._check_open()
        return self._iter_sync() if self.config.sync else self._iter_async()

    def _iter_sync(self) -> Iterator[BatchHandle]:
        while True:
            round_ = [f for f in (self._submit_next(s) for s in range(self.num_streams)) if f]
            if not round_:
                return
            # Results are fetched as tasks finish, and handed over in batch order.
            ac = as_completed(round_, loop=self.client.loop, with_results=True)
            done: dict[Future, BatchHandle] = {}
            for fut in round_:
                while fut not in done:
                    f, handle = next(ac)
                    done[f] = handle
                yield self._hand_over(fut, done.pop(fut))

    def _iter_async(self) -> Iterator[BatchHandle]:
        first = [self._submit_next(s) for _ in range(self.config.batches_in_flight)
                 for s in range(self.num_streams)]
        ac = as_completed([f for f in first if f], loop=self.client.loop, with_results=True)
        for fut, result in ac:
            stream = self._pending[fut].stream
            handle = self._hand_over(fut, result)
            nxt = self._submit_next(stream)
            if nxt is not None:
                ac.add(nxt)
            yield handle

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
        pending = list(getattr(self, "_pending", {}))
        if pending:
            self.client.cancel(pending)
        if self.client.status == "running":
            for v in list(getattr(self, "_weights", {})):
                self._unpublish(v)
        self._weights = {}
        self._pending = {}
        self._finalizer()

    @staticmethod
    def _cleanup(client: Client, cluster: LocalCluster | None, plugin_name: str) -> None:
        try:
            if client.status == "running":
                client.unregister_worker_plugin(plugin_name)
        except Exception:  # the cluster may already be gone
            logger.debug("could not unregister %s", plugin_name, exc_info=True)
        if cluster is not None:
            client.close()
            cluster.close()

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _with_lag(handle: BatchHandle, lag: int) -> BatchHandle:
    import dataclasses

    return dataclasses.replace(handle, policy_lag=lag)
