"""The learner's facade: :class:`Collector` starts a collection, drives it, and closes it.

The parts behind it: ``_startup`` (plugin, checks, store probe, version 0, run number),
``_planner`` (budget, streams, ids), ``_streams`` and ``_channel`` (one long-lived task per
stream, handles straight to the learner), ``_supervisor`` (live workers, deadlines),
``_handover`` (policy-lag rule, statistics), ``_run`` (one started collection), ``_metrics``
(what the loggers get, once per handle handed over) and :mod:`daskrl.weights._publish`. Each
cluster operation is one coroutine, run by the client's own sync machinery (``client.sync``)
for a synchronous client and awaited by the caller with an asynchronous one: both get the same
checks and the same fault supervision.
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import AsyncIterator, Generator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
from distributed import Client, Future, LocalCluster

from daskrl.collect._checks import check_on_learner
from daskrl.collect._env_list import env_labels
from daskrl.collect._lifecycle import (
    Closing,
    State,
    WeightsVersion,
    field_values,
    finalize,
    release,
)
from daskrl.collect._metrics import MetricsFeed
from daskrl.collect._resume import Resume, plan_resume, run_settings
from daskrl.collect._run import Run
from daskrl.collect._startup import start_on_cluster
from daskrl.config import CollectorConfig, CollectorOptions, check_option_names, renamed_options
from daskrl.deploy._cluster import check_main_importable, dashboard_link, local_cluster
from daskrl.errors import CollectorClosedError, UsageError
from daskrl.loggers._protocol import LoggerLike
from daskrl.store._handles import BatchHandle
from daskrl.store._store import TrajectoryStore
from daskrl.weights._cache import WeightsRef
from daskrl.weights._in_store import StoreWeightsWriter
from daskrl.weights._publish import Preloads, WeightsPublisher
from daskrl.weights._snapshot import PolicyLike
from daskrl.worker._envs import EnvLike
from daskrl.worker._tasks import preload_shared_weights, preload_weights

if TYPE_CHECKING:  # typing.Unpack is new in Python 3.11; daskrl supports 3.10
    from typing_extensions import Unpack

__all__ = ["Collector"]


class Collector:
    """Collect experience from gymnasium envs on Dask workers into a zarr store.

    Parameters
    ----------
    env
        A gymnasium id (``"module:Id"`` imports the module that registers it), an import path
        ``"module:factory"``, or a zero-argument factory returning a ``gymnasium.Env``; or a
        list of them, one env per stream (stream ``s`` collects env ``s % len(env)``; they
        must share their spaces; ``docs/env-kinds.md``, "Several envs"). A factory may return
        a ``gymnasium.vector.VectorEnv``, whose ``num_envs`` is then ``envs_per_worker``; an id
        becomes one with ``vectorization_mode`` (``docs/env-kinds.md``, "Vector envs").
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
    dashboard
        The embedded cluster's Dask dashboard, on ``127.0.0.1`` only: ``True`` (port 8787, or
        the next free one), a port (``0``: any free one), or ``None``/``False`` (default: no
        dashboard, no HTTP server at all). Needs ``daskrl[dashboard]`` (bokeh). Its link is
        :attr:`dashboard_link`. Not valid with ``client``: that cluster has its own.
    config, **options
        The options, each a field of :class:`~daskrl.config.CollectorConfig` (where their
        defaults and documentation live): a ``config``, and/or keyword options (which
        override the config's).
    loggers
        Where the running metrics go as batches are handed over: :mod:`daskrl.loggers`
        objects (``TensorBoardLogger``, ``WandbLogger``, ``MLflowLogger``, anything with
        ``log_metrics(metrics, step)``) or callables ``f(metrics, step)``; keys in
        :data:`daskrl.loggers.METRIC_KEYS`. They stay on the learner (never pickled, not in
        the run record) and are closed with the collector; one that raises is closed and
        dropped with a :class:`~daskrl.MetricsLoggerWarning` (``docs/integrations/logging.md``).

    Examples
    --------
    >>> with Collector("CartPole-v1", policy, "runs/demo", total_frames=8192) as collector:
    ...     for handle in collector:
    ...         batch = handle.load(device="cpu")
    ...         collector.update_weights(policy)

    With an asynchronous ``Client``, start it with ``await Collector(...)`` or ``async with``,
    await ``update_weights`` (a :class:`WeightsVersion`, an ``int``), ``close`` and ``submit()``
    futures, and iterate with ``async for`` (``docs/collecting.md``); both kinds of client get
    the same checks and fault supervision.
    """

    def __init__(self, env: EnvLike | Sequence[EnvLike], policy: PolicyLike, store: str, *,
                 storage_options: Mapping[str, Any] | None = None, client: Client | None = None,
                 config: CollectorConfig | None = None,
                 dashboard: bool | int | None = None, loggers: Sequence[LoggerLike] = (),
                 **options: Unpack[CollectorOptions]) -> None:
        self.state = State.CREATED
        self._run: Run | None = None
        self._metrics = MetricsFeed(loggers)
        # 1. Everything that can be checked on the learner, before any worker spends time.
        # The embedded cluster (client=None) runs thread workers for a memory:// store (one
        # process), worker processes otherwise, which must be able to import __main__.
        processes = not str(store).startswith("memory://")
        if client is None and processes:
            check_main_importable()
        check_option_names(options)
        given_options = renamed_options(options, stacklevel=2)  # the warning names the caller
        base = field_values(config) if config is not None else {}
        merged = {**base, **given_options}
        given = "envs_per_worker" in options or (config is not None and config.envs_per_worker
                                                 != CollectorConfig.envs_per_worker)
        # A vector env's num_envs is envs_per_worker: until the learner has made the envs, the
        # other settings are checked against one env per stream (unless it was given).
        checked = check_on_learner(env, policy, store, storage_options, merged, given)
        assert checked.config is not None
        self.config = cfg = checked.config
        self.env_spec, self._policy_spec, self._store = (checked.env_spec, checked.policy_spec,
                                                         checked.store)
        self.observation_space, self.action_space = checked.observation_space, checked.action_space
        self.env_specs = checked.env_specs
        """Every env of the collection, by env index (``BatchHandle.env``)."""
        module = checked.module
        self.run = -1  # the run number in the store: registered last, once started
        self._settings = run_settings(env_labels(checked.env_specs), checked.observation_space,
                                      checked.action_space, cfg)
        self._resume = plan_resume(self._store, cfg.resume, self._settings)  # before workers
        # 2. The cluster.
        own: LocalCluster | None = None
        if client is not None and (dashboard is not None and dashboard is not False):
            raise UsageError("dashboard= configures the embedded cluster (client=None); the "
                             "given client's cluster serves its own: see client.dashboard_link.")
        if client is None:
            own = local_cluster(cfg.num_workers, dashboard=dashboard, processes=processes)
            client = Client(own, set_as_default=False)
        elif not isinstance(client, Client):
            raise UsageError(f"client must be a distributed.Client or None, got {client!r}.")
        self.dashboard_link: str | None = dashboard_link(own) if own is not None else None
        """Link to the embedded cluster's dashboard (``http://127.0.0.1:PORT/status``) when
        ``dashboard`` asked for one; None otherwise."""
        self.client: Client = client
        self._asynchronous = bool(client.asynchronous)
        self._id = uuid.uuid4().hex[:10]
        self._plugin_name = f"daskrl-{self._id}"
        in_store = (StoreWeightsWriter(self._store.backend, self._store.url, self._id)
                    if cfg.weights_in_store else None)
        self._weights = WeightsPublisher(client, self._plugin_name, self._id,
                                         Preloads(preload_weights, preload_shared_weights),
                                         shared_memory=cfg.shared_memory, in_store=in_store)
        self._finalizer = weakref.finalize(self, finalize, client, own, self._asynchronous,
                                           self._plugin_name, self._weights, cfg.call_timeout)
        self._module: torch.nn.Module | None = module
        if not self._asynchronous:
            try:
                self.client.sync(self._start)
            except BaseException:
                self.close()
                raise

    # -- start-up (one coroutine for both clients) ---------------------------------------------
    async def _start(self) -> Collector:
        if self.state is not State.CREATED:
            return self
        self.state = State.STARTING
        try:
            module, self._module = self._module, None
            assert module is not None
            self._run, self.run = await start_on_cluster(
                self.client, self.config, self.env_specs, self._policy_spec, module, self._store,
                self._plugin_name, self._id, self._weights, self._settings, self._resume)
        except BaseException:
            await self._aclose()
            raise
        self.state = State.RUNNING
        return self

    def __await__(self) -> Generator[Any, None, Collector]:
        return self._start().__await__()

    async def __aenter__(self) -> Collector:
        return await self._start()

    async def __aexit__(self, *exc: object) -> None:
        await self._aclose()

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the public surface ----------------------------------------------------------------------
    def _running(self) -> Run:
        if self.state in (State.CLOSING, State.CLOSED):
            raise CollectorClosedError("this collector is closed; create a new one.")
        if self._run is None or self.state is not State.RUNNING:
            raise UsageError(
                "this collector has an asynchronous client and is not started yet: use "
                "`collector = await Collector(...)` or `async with Collector(...) as collector`.")
        return self._run

    def update_weights(self, policy: torch.nn.Module, *, wait: bool = False) -> WeightsVersion:
        """Publish ``policy``'s current weights as a new version; return its number.

        The weights are copied now, so the learner may change them in place right after.
        Batches submitted from now on use this version. Each worker fetches a version once,
        when its first batch on that version starts; ``wait=True`` instead pushes it to every
        worker now and returns once all have verified and loaded it. Batches already in flight
        keep theirs. With an asynchronous client, await the result before the next update.
        """
        run = self._running()
        snap = self._weights.take_snapshot(policy)
        if self._asynchronous:
            return WeightsVersion(snap.version, run.publish(snap, wait))
        return WeightsVersion(int(self.client.sync(run.publish, snap, wait)))

    @property
    def weights_version(self) -> int:
        """The newest published weights version."""
        return self._weights.version

    @property
    def plugin_name(self) -> str:
        """Name of the worker plugin this collector installs: its state on each worker is
        ``dask_worker.plugins[collector.plugin_name]`` (e.g. in ``client.run``)."""
        return self._plugin_name

    def weights_ref(self, version: int | None = None) -> WeightsRef:
        """What batch tasks carry for weights ``version`` (default: the newest): the name of
        the Dask-published snapshot, or a shared-memory manifest (names, offsets, checksums)."""
        return self._weights.ref(self._weights.version if version is None else version)

    def weights_key(self, version: int) -> str:
        """The name weights ``version`` is published under (``client.get_dataset``)."""
        return self._weights.name(version)

    @property
    def weights_transport(self) -> str:
        """How weights reach workers now: ``"shared-memory"`` (workers on this machine read
        one copy in place), ``"dask"`` (each worker receives a copy over the network) or
        ``"store"`` (``weights_in_store``: read from the store, once per host)."""
        return self._weights.transport

    @property
    def learner_address(self) -> str:
        """The address the collection's streams connect to, to send their handles (the
        learner's listener: ``docs/collecting.md``, "Streams"); the workers must reach it."""
        return self._running().streams.address

    @property
    def num_streams(self) -> int:
        """Env streams collected in parallel (``num_workers``, or the cluster's workers)."""
        return self._running().num_streams

    @property
    def resumed(self) -> Resume | None:
        """What this collector resumes (``resume=``): the run, the runs whose committed frames
        count toward ``total_frames``, and those frames (counted as it started); None for a
        new collection. ``run`` stays -1 when nothing was left to collect."""
        return self._run.resume if self._run is not None else self._resume

    @property
    def store(self) -> TrajectoryStore:
        """The store this collector writes to (for reading back)."""
        return self._store

    @property
    def in_flight(self) -> int:
        """Batches submitted and not yet handed over (queued, running, or done and waiting)."""
        return self._run.in_flight if self._run else 0

    def submit(self) -> Future:
        """Submit the next batch now; return a ``distributed.Future`` of its handle.

        The future works with ``distributed.wait``, ``as_completed`` (inside
        ``with collector.client.as_current():`` unless it is the default client) and ``await``
        (with an asynchronous client). Pass its handle to :meth:`hand_over` to get its
        ``policy_lag`` and count it in :meth:`summary`. Cancelling the future before its batch
        starts leaves nothing in the store; cancelling it while the batch runs stops the
        batch before its write, unless the write has begun. A cancelled batch's frames are not
        collected again. The caller owns the future: it is not re-dispatched.
        """
        run = self._running()
        plan = run.planner.next()
        if plan is None:
            raise CollectorClosedError(
                f"total_frames={self.config.total_frames} are all submitted; no batch is left.")
        if self._asynchronous:  # lost weights are scattered again by the next supervised wait
            return run.submit_now(plan)
        return cast(Future, self.client.sync(run.submit, plan))

    def hand_over(self, handle: BatchHandle | Future) -> BatchHandle:
        """Take over the handle of a batch from :meth:`submit`; return it with its policy lag.

        The handle a ``submit()`` future resolves to has ``policy_lag=0``: the lag is only
        known when the learner takes the batch. ``hand_over`` sets it (the newest weights
        version now minus the batch's ``weights_version``), counts the batch in
        :meth:`summary` and lets the collector forget the future. Pass the handle (or, with a
        synchronous client, the future itself). ``max_policy_lag`` does not apply here.
        """
        run = self._running()
        if isinstance(handle, Future):
            if self._asynchronous:
                raise UsageError(
                    "hand_over got a Future, but this collector's client is asynchronous: "
                    "pass the handle instead, collector.hand_over(await future).")
            return self._log(run, run.hand_over(handle.result(), handle))
        return self._log(run, run.hand_over(handle))

    def _log(self, run: Run, handle: BatchHandle) -> BatchHandle:
        """Send ``handle``'s metrics to the loggers (on the learner, once per handle)."""
        if self._metrics:
            self._metrics.handed_over(handle, run.handover.stats,
                                      weights_version=self._weights.version,
                                      in_flight=run.in_flight, store=self._store)
        return handle

    def __iter__(self) -> Iterator[BatchHandle]:
        run = self._running()
        if self._asynchronous:
            raise UsageError("this collector's client is asynchronous: use `async for`.")
        return self._iterate(run)

    def _iterate(self, run: Run) -> Iterator[BatchHandle]:
        while (handle := self.client.sync(run.next_handle)) is not None:
            yield self._log(run, handle)

    def __aiter__(self) -> AsyncIterator[BatchHandle]:
        run = self._running()
        if not self._asynchronous:
            raise UsageError(
                "`async for` needs a collector with an asynchronous client "
                "(Client(..., asynchronous=True)); with this one, use a plain `for` loop.")
        return self._aiterate(run)

    async def _aiterate(self, run: Run) -> AsyncIterator[BatchHandle]:
        while (handle := await run.next_handle()) is not None:
            yield self._log(run, handle)

    def summary(self) -> dict[str, Any]:
        """Running totals over the batches handed over to the learner (works after close).

        Keys: ``frames``, ``batches``, ``seconds`` (since start), ``fps`` (frames/s handed
        over), ``episodes`` (finished), ``mean_return`` and ``mean_length`` (last 100
        episodes), ``policy_lag_mean``, ``policy_lag_max``, ``policy_lag_counts``
        (``{lag: batches}``), ``dropped_stale`` and ``dropped_frames`` (batches not handed over
        because of ``max_policy_lag``), ``workers`` (per address: ``batches``, ``frames``,
        ``fps`` over the run's wall time, ``rollout_fps`` while stepping, ``write_seconds``),
        ``in_flight``, ``weights_version`` and ``store``.
        """
        run = self._run if self._run is not None else self._running()
        return {**run.handover.summary(), "in_flight": self.in_flight,
                "weights_version": self._weights.version, "store": self._store.url}

    # -- closing ---------------------------------------------------------------------------------
    def close(self) -> Closing:
        """Stop outstanding tasks, free worker state, close an embedded cluster.

        With a synchronous client the collector is closed when this returns; with an
        asynchronous one, ``await collector.close()`` (or use :meth:`aclose`).
        """
        if self._asynchronous:
            return Closing(self._aclose())
        if self.state is not State.CLOSED:
            if self.client.status == "running":
                self.client.sync(self._aclose)
            self.state = State.CLOSED
        self._finalizer()  # closes an embedded cluster; shared memory is freed in any case
        self._metrics.close()
        return Closing()

    async def aclose(self) -> None:
        """Close (see :meth:`close`) from async code, with an asynchronous client."""
        await self._aclose()

    async def _aclose(self) -> None:
        if self.state in (State.CLOSING, State.CLOSED):
            return
        self.state = State.CLOSING
        try:
            if self._run is not None:
                await self._run.close()
            await release(self.client, self._plugin_name, self._weights,
                           self.config.call_timeout)
        finally:
            self.state = State.CLOSED
            if self._asynchronous:
                self._finalizer.detach()
                self._weights.segments.close()
                self._metrics.close()
