"""The learner's facade: :class:`Collector` starts a collection, drives it, and closes it.

The parts behind it: ``_setup`` (what is checked and made before the start), ``_startup``
(plugin, checks, store probe, version 0, run number),
``_planner`` (budget, streams, ids), ``_streams`` and ``_channel`` (one long-lived task per
stream, handles straight to the learner), ``_supervisor`` (live workers, deadlines),
``_handover`` (policy-lag rule, statistics), ``_run`` (one started collection), ``_metrics``
(what the loggers get, once per handle handed over), ``_updates`` (weights versions in call
order) and :mod:`daskrl.weights._publish`. Each cluster operation is one coroutine, which
:meth:`Collector._call` runs as distributed's ``SyncMethodMixin.sync`` does: to completion
through the client's own sync machinery for a synchronous client, handed back to be awaited
with an asynchronous one. Both do the same work, with the same checks and fault supervision.
"""

from __future__ import annotations

import weakref
from collections.abc import (
    AsyncIterator,
    Callable,
    Coroutine,
    Generator,
    Iterator,
    Mapping,
    Sequence,
)
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from distributed import Client, Future

from daskrl._renamed import Renamed
from daskrl.collect._lifecycle import Closing, State, finalize, release
from daskrl.collect._metrics import MetricsFeed
from daskrl.collect._resume import Resume
from daskrl.collect._run import Run
from daskrl.collect._setup import Prepared, prepare
from daskrl.collect._startup import start_on_cluster
from daskrl.collect._updates import WeightsUpdates
from daskrl.config import CollectorConfig, CollectorOptions
from daskrl.errors import CollectorClosedError, UsageError
from daskrl.loggers._protocol import LoggerLike
from daskrl.store._handles import BatchHandle
from daskrl.store._store import TrajectoryStore
from daskrl.weights._cache import WeightsRef
from daskrl.weights._snapshot import PolicyLike
from daskrl.worker._envs import EnvLike

if TYPE_CHECKING:  # typing.Unpack is new in Python 3.11; daskrl supports 3.10
    from typing_extensions import Unpack

__all__ = ["Collector"]

T = TypeVar("T")


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
        Where the running metrics (:data:`daskrl.loggers.METRIC_KEYS`) go as batches are
        handed over: :mod:`daskrl.loggers` objects, anything with ``log_metrics(metrics,
        step)``, or callables ``f(metrics, step)``. They stay on the learner and are closed
        with the collector; one that raises is closed and dropped with a
        :class:`~daskrl.MetricsLoggerWarning` (``docs/integrations/logging.md``).

    Examples
    --------
    >>> with Collector("CartPole-v1", policy, "runs/demo", total_frames=8192) as collector:
    ...     for handle in collector:
    ...         batch = handle.load(device="cpu")
    ...         collector.update_weights(policy)

    With an asynchronous ``Client``, start it with ``await Collector(...)`` or ``async with``,
    await ``update_weights``, ``submit`` (then its future) and ``close``, and iterate with
    ``async for`` (``docs/collecting.md``): the same work as with a synchronous one.
    """

    run = Renamed("run_number")
    """Deprecated alias of :attr:`run_number`."""

    def __init__(self, env: EnvLike | Sequence[EnvLike], policy: PolicyLike, store: str, *,
                 storage_options: Mapping[str, Any] | None = None, client: Client | None = None,
                 config: CollectorConfig | None = None,
                 dashboard: bool | int | None = None, loggers: Sequence[LoggerLike] = (),
                 **options: Unpack[CollectorOptions]) -> None:
        self.state = State.CREATED
        self._run: Run | None = None
        self._metrics = MetricsFeed(loggers)
        self._ready: Prepared | None = prepare(env, policy, store, storage_options, client,
                                               config, dashboard, options)  # until started
        ready = self._ready
        self.config, self.env_spec = ready.config, ready.env_spec
        self.store: TrajectoryStore = ready.store
        """The store this collector writes to (for reading back)."""
        self.observation_space, self.action_space = ready.observation_space, ready.action_space
        self.env_specs = ready.env_specs
        """Every env of the collection, by env index (``BatchHandle.env``)."""
        self.run_number = -1
        """The run's number in the store (``store.runs()``): -1 until it is registered, last
        in the start (and for a resumed collection with nothing left to collect)."""
        self._resume = ready.resume
        self.dashboard_link: str | None = ready.dashboard_link
        """Link to the embedded cluster's dashboard (``http://127.0.0.1:PORT/status``) when
        ``dashboard`` asked for one; None otherwise."""
        self.client: Client = ready.client
        self._asynchronous = bool(self.client.asynchronous)
        self._id, self._weights = ready.key, ready.weights
        self.plugin_name = ready.plugin_name
        """Name of the worker plugin this collector installs: its state on each worker is
        ``dask_worker.plugins[collector.plugin_name]`` (e.g. in ``client.run``)."""
        self._finalizer = weakref.finalize(self, finalize, self.client, ready.cluster,
                                           self._asynchronous, self.plugin_name, self._weights,
                                           self.config.call_timeout)
        self._updates = WeightsUpdates(self._weights)
        if not self._asynchronous:  # an asynchronous client's collector starts when awaited
            try:
                self._call(self._start)
            except BaseException:
                self.close()
                raise

    def _call(self, func: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> Any:
        """Run ``func(*args)`` as distributed's ``SyncMethodMixin.sync`` does: to completion on
        the client's loop with a synchronous client (its result), else the coroutine to await."""
        return func(*args) if self._asynchronous else self.client.sync(func, *args)

    async def _start(self) -> Collector:
        if self.state is not State.CREATED:
            return self
        self.state = State.STARTING
        try:
            ready, self._ready = self._ready, None  # the policy module is not kept
            assert ready is not None
            self._run, self.run_number = await start_on_cluster(ready)
        except BaseException:
            await self.aclose()
            raise
        self.state = State.RUNNING
        return self

    def __await__(self) -> Generator[Any, None, Collector]:
        return self._start().__await__()

    async def __aenter__(self) -> Collector:
        return await self._start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _running(self) -> Run:
        if self.state in (State.CLOSING, State.CLOSED):
            raise CollectorClosedError("this collector is closed; create a new one.")
        if self._run is None or self.state is not State.RUNNING:
            raise UsageError(
                "this collector has an asynchronous client and is not started yet: use "
                "`collector = await Collector(...)` or `async with Collector(...) as collector`.")
        return self._run

    def update_weights(self, policy: torch.nn.Module, *, wait: bool = False) -> Any:
        """Publish ``policy``'s current weights as a new version; return its number (with an
        asynchronous client, a coroutine: ``await`` it to publish, for the number).

        The weights are copied now, so the learner may change them in place right after.
        Batches submitted from now on use this version. Each worker fetches a version once,
        when its first batch on that version starts; ``wait=True`` instead pushes it to every
        worker now and returns once all have verified and loaded it. Batches already in flight
        keep theirs. Versions are published in call order: awaiting an update publishes first
        the updates called before it and not awaited yet.
        """
        run = self._running()
        return self._call(self._updates.publish, run, self._updates.take(policy, wait))

    @property
    def weights_version(self) -> int:
        """The newest published weights version."""
        return self._weights.version

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
        one copy in place), ``"dask"`` (a copy over the network) or ``"store"``."""
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
        new collection."""
        return self._run.resume if self._run is not None else self._resume

    @property
    def in_flight(self) -> int:
        """Batches submitted and not yet handed over (queued, running, or done and waiting)."""
        return self._run.in_flight if self._run else 0

    def submit(self) -> Any:
        """Submit the next batch now; return a ``distributed.Future`` of its handle (with an
        asynchronous client, a coroutine: ``await`` it for the future).

        The future works with ``distributed.wait``, ``as_completed`` (inside
        ``with collector.client.as_current():`` unless it is the default client) and ``await``.
        Pass its handle to :meth:`hand_over` to get its ``policy_lag`` and count it in
        :meth:`summary`. Cancelling the future before its batch starts leaves nothing in the
        store; cancelling it while the batch runs stops the batch before its write, unless the
        write has begun. A cancelled batch's frames are not collected again. The caller owns
        the future: it is not re-dispatched.
        """
        return self._call(self._running().submit)

    def hand_over(self, handle: BatchHandle | Future) -> BatchHandle:
        """Take over the handle of a batch from :meth:`submit`; return it with its policy lag.

        A ``submit()`` future's handle has ``policy_lag=0``; ``hand_over`` sets it (the newest
        weights version now minus the batch's ``weights_version``), counts the batch in
        :meth:`summary` and lets the collector forget the future. Pass the handle (or, with a
        synchronous client, the future). ``max_policy_lag`` does not apply here.
        """
        run = self._running()
        if isinstance(handle, Future):
            if self._asynchronous:
                raise UsageError("hand_over got a Future, but this collector's client is "
                                 "asynchronous: use collector.hand_over(await future).")
            return self._log(run, run.hand_over(handle.result(), handle))
        return self._log(run, run.hand_over(handle))

    def _log(self, run: Run, handle: BatchHandle) -> BatchHandle:
        """Send ``handle``'s metrics to the loggers (on the learner, once per handle)."""
        self._metrics.handed_over(handle, run.handover.stats, weights_version=self.weights_version,
                                  in_flight=run.in_flight, store=self.store)
        return handle

    def __iter__(self) -> Iterator[BatchHandle]:
        run = self._running()
        if self._asynchronous:
            raise UsageError("this collector's client is asynchronous: use `async for`.")
        return self._iterate(run)

    def _iterate(self, run: Run) -> Iterator[BatchHandle]:
        while (handle := self._call(run.next_handle)) is not None:
            yield self._log(run, handle)

    def __aiter__(self) -> AsyncIterator[BatchHandle]:
        run = self._running()
        if not self._asynchronous:
            raise UsageError("`async for` needs a collector with an asynchronous client "
                             "(Client(..., asynchronous=True)); with this one, use `for`.")
        return self._aiterate(run)

    async def _aiterate(self, run: Run) -> AsyncIterator[BatchHandle]:
        while (handle := await self._call(run.next_handle)) is not None:
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
                "weights_version": self._weights.version, "store": self.store.url}

    def close(self) -> Closing:
        """Stop outstanding tasks, free worker state, close an embedded cluster.

        With a synchronous client the collector is closed when this returns; with an
        asynchronous one, ``await collector.close()`` (or use :meth:`aclose`).
        """
        running = self._asynchronous or self.client.status == "running"
        closing = self._call(self.aclose) if running else None
        if not self._asynchronous:  # off the event loop: it may close the embedded cluster
            self.state = State.CLOSED
            self._free()
        return Closing(closing)

    async def aclose(self) -> None:
        """Close (see :meth:`close`) from async code, with an asynchronous client."""
        if self.state in (State.CLOSING, State.CLOSED):
            return
        self.state = State.CLOSING
        try:
            if self._run is not None:
                await self._run.close()
            await release(self.client, self.plugin_name, self._weights,
                           self.config.call_timeout)
        finally:
            self.state = State.CLOSED
            self._updates.close()
            if self._asynchronous:  # else close() frees it, off the loop
                self._free()

    def _free(self) -> None:
        """Free what the learner holds: shared memory, an embedded cluster, the loggers."""
        self._finalizer()
        self._metrics.close()
