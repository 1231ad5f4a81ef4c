"""The learner's side of weights: versions published to the workers, and taken back.

:class:`WeightsPublisher` copies the policy's weights at each ``update_weights`` (into a
shared-memory segment for workers on the learner's machine, else into the arrays of a released
version), writes it to the store (``weights_in_store``) or sends a version that goes through
Dask to one responsive worker (its seed) and publishes it by name, preloads a version on every
worker on request, falls back to Dask transfers when a worker cannot read shared memory,
scatters again a version lost with its worker, and unpublishes versions no batch needs any
more.

The cluster calls are coroutines on the client's event loop; the liveness of workers and the
deadlines come from the collector's supervision (:class:`Cluster`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, NamedTuple, Protocol, TypeVar

import torch
from distributed import Client, Future

from daskrl.errors import ClusterTimeoutError, InternalError, PolicyError, WeightsNotSharedError
from daskrl.weights._cache import IN_PROCESS_WEIGHTS, WeightsRef, weights_name
from daskrl.weights._in_store import StoreWeightsWriter
from daskrl.weights._segments import SegmentPool, SharedWeights
from daskrl.weights._snapshot import WeightsSnapshot, snapshot, weights_layout
from daskrl.weights._tree import tree_enabled, tree_hosts, tree_name

__all__ = ["Cluster", "Preloads", "WeightsPublisher"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

class Cluster(Protocol):
    """What publishing needs of the collector's supervision (see ``collect._supervisor``)."""

    call_timeout: float

    async def bounded(self, what: str, awaitable: Awaitable[T]) -> T: ...
    async def refresh(self, force: bool = False) -> set[str]: ...
    def drop(self, worker: str, why: str) -> None: ...
    async def wait_each(self, futures: dict[str, Future], what: str) -> dict[str, Future]: ...


class Preloads(NamedTuple):
    """The worker-side calls that load a version on every worker now (the worker layer's,
    given by the collector): ``task(plugin_name, version, ref)``, a task; ``shared(plugin_name,
    version, manifest, dask_worker)``, for ``Client.run``, from shared memory."""

    task: Callable[..., Any]
    shared: Callable[..., Any]


class WeightsPublisher:
    """Every weights version of one collector, from snapshot to unpublish.

    ``shared_memory``: versions go to shared memory (POSIX only: Windows cannot remove a file
    a worker still maps) until a worker cannot read it. ``in_store``: every version is written
    to the store instead (the learner's writer of it), and no version goes through Dask.
    ``in_process``: some workers share the learner's process and read its snapshots in place.
    ``preloads``: how ``wait=True`` loads a version on every worker.
    """

    def __init__(self, client: Client, plugin_name: str, key_prefix: str, preloads: Preloads,
                 *, shared_memory: bool, in_store: StoreWeightsWriter | None = None) -> None:
        self.client = client
        self.preloads = preloads
        self.plugin_name = plugin_name
        self.key_prefix = key_prefix
        self.in_process = False
        self.version = -1
        """The newest published version."""
        self.snapshots: dict[int, WeightsSnapshot] = {}  # every published version
        self.futures: dict[int, Future] = {}  # the versions published through Dask
        self.in_store = in_store
        self.segments = SegmentPool(enabled=shared_memory and os.name == "posix"
                                    and in_store is None)
        self._spare: WeightsSnapshot | None = None  # arrays of a released version, to reuse
        self._layout: tuple[Any, ...] | None = None
        self._seed_turn = 0

    def name(self, version: int) -> str:
        """The name ``version`` is published under."""
        return weights_name(self.plugin_name, version)

    @property
    def transport(self) -> str:
        """``"store"``, ``"dask"`` if the newest version went through Dask, else
        ``"shared-memory"``."""
        if self.in_store is not None:
            return "store"
        return "dask" if self.version in self.futures else "shared-memory"

    def take_snapshot(self, policy: torch.nn.Module,
                      version: int | None = None) -> WeightsSnapshot:
        """Copy ``policy``'s weights now as ``version`` (default: the one after the newest
        published), not yet published."""
        if not isinstance(policy, torch.nn.Module):
            raise PolicyError(
                f"update_weights expects a torch.nn.Module, got {type(policy).__name__}.")
        layout = weights_layout(policy)
        if self._layout is not None and layout != self._layout:
            raise PolicyError(
                "update_weights got a policy whose parameters/buffers differ from the one "
                "the collector started with (names, dtypes or shapes changed). Make a new "
                "Collector for a new architecture."
            )
        self._layout = layout
        if version is None:
            version = self.version + 1
        spare, self._spare = self._spare, None
        shared = self.segments.write(policy, version, layout)
        if shared is not None:
            return shared[0]
        out = dict(zip(spare.names, spare.arrays)) if spare else None
        return snapshot(policy, version, out=out)

    async def publish(self, snap: WeightsSnapshot, cluster: Cluster, in_use: Iterable[int],
                      wait: bool) -> int:
        """Make ``snap`` the newest version; unpublish versions not ``in_use`` by a batch;
        ``wait``: load it on every worker now."""
        if self.in_process:
            IN_PROCESS_WEIGHTS[self.name(snap.version)] = snap
        if self.in_store is not None:  # off the event loop: 100 MiB is ~0.1 s of writing
            await cluster.bounded(
                f"writing weights version {snap.version} to the store",
                asyncio.get_running_loop().run_in_executor(None, self.in_store.write, snap))
        elif self.segments.manifest(snap.version) is None:  # else tasks carry the manifest
            self.futures[snap.version] = await self._scatter(snap, cluster)
        self.snapshots[snap.version] = snap
        self.version = snap.version
        keep = set(in_use) | {self.version}
        for v in [v for v in self.snapshots if v not in keep]:
            await self.unpublish(v, cluster)
        if wait:
            await self._preload(snap.version, cluster)
        return snap.version

    async def _scatter(self, snap: WeightsSnapshot, cluster: Cluster) -> Future:
        """Send ``snap`` to one responsive worker, the version's seed, and publish it by name,
        with the tree its hosts pass it on in (:mod:`daskrl.weights._tree`): every other host
        fetches it from its parent there when its first batch on that version starts (the
        learner sends one copy per version, however many hosts). A seed that does not take it
        within ``call_timeout`` is dropped and the next one tried."""
        t = cluster.call_timeout
        live = sorted(await cluster.refresh(force=True))
        self._seed_turn += 1
        k = self._seed_turn % len(live) if live else 0
        for seed in live[k:] + live[:k]:
            try:
                # A list, so scatter makes one future of the whole snapshot.
                [future] = await cluster.bounded(
                    f"sending weights version {snap.version} to {seed}",
                    self.client.scatter([snap], workers=[seed], hash=False, timeout=t))
            except (TimeoutError, asyncio.TimeoutError, OSError, KeyError) as e:
                # KeyError: the scheduler no longer knows the seed (it left just now)
                cluster.drop(seed, f"sending weights version {snap.version} failed "
                                   f"({type(e).__name__}: {e})")
                continue
            datasets: dict[str, Any] = {self.name(snap.version): future}
            if tree_enabled():  # hosts fetch from one another: see weights._tree
                datasets[tree_name(self.name(snap.version))] = tree_hosts(live, seed)
            await cluster.bounded(
                f"publishing weights version {snap.version}",
                self.client.publish_dataset(override=True, **datasets))
            return future
        raise ClusterTimeoutError(
            f"weights version {snap.version} could not be sent to any worker within "
            f"call_timeout={t:g}s each. Check that the workers can reach the learner and the "
            "scheduler."
        )

    def ref(self, version: int) -> WeightsRef:
        """How a task finds ``version``: its manifest in the store or in shared memory, or its
        data key."""
        if self.in_store is not None and version in self.in_store.versions:
            return self.in_store.versions[version]
        if version in self.futures:
            return str(self.futures[version].key)
        manifest = self.segments.manifest(version)
        if manifest is None:
            raise InternalError(f"weights version {version} is unknown to its publisher")
        return manifest

    async def _preload(self, version: int, cluster: Cluster) -> None:
        """Load ``version`` on every worker now; a worker that cannot read shared memory
        switches the collector to Dask transfers, and the load is done again that way."""
        weights = self.ref(version)
        if isinstance(weights, SharedWeights):
            live = sorted(await cluster.refresh(force=True))
            try:
                results = await cluster.bounded(
                    "loading weights from shared memory",
                    self.client.run(self.preloads.shared, self.plugin_name, version, weights,
                                    workers=live, on_error="return"))
            except ClusterTimeoutError as e:  # a worker did not answer: tasks, one by one
                logger.warning("%s; loading version %d with tasks instead", e, version)
                results = {}
            errors = [r for r in results.values() if isinstance(r, BaseException)]
            if results and not errors:
                return
            if not all(isinstance(e, WeightsNotSharedError) for e in errors):
                raise next(e for e in errors if not isinstance(e, WeightsNotSharedError))
            if errors:
                await self.stop_sharing(errors[0], cluster)
            weights = self.ref(version)
        futures = {
            w: self.client.submit(self.preloads.task, self.plugin_name, version, weights,
                                  key=f"daskrl-preload-{self.key_prefix}-{version}-{w}",
                                  workers=[w], pure=False)
            for w in sorted(await cluster.refresh(force=True))
        }
        await cluster.wait_each(futures, f"loading weights version {version}")

    async def stop_sharing(self, reason: BaseException, cluster: Cluster) -> None:
        """A worker cannot read the shared-memory weights: send every version through Dask."""
        self.segments.enabled = False
        unpublished = [v for v in self.snapshots if v not in self.futures]
        if unpublished:
            logger.warning("weights now go to workers through Dask: %s", reason)
        for version in unpublished:
            self.futures[version] = await self._scatter(self.snapshots[version], cluster)

    async def republish_lost(self, cluster: Cluster) -> None:
        """Scattered data dies with its worker: scatter lost versions again from the learner
        (later, on the next health check, if no worker is there to take them now)."""
        lost = [v for v, f in self.futures.items() if f.status in ("lost", "cancelled", "error")]
        if not lost or not await cluster.refresh(force=True):
            return
        for version in lost:
            logger.warning("weights version %d was lost with its worker(s); scattering it "
                           "again", version)
            try:
                self.futures[version] = await self._scatter(self.snapshots[version], cluster)
            except (TimeoutError, asyncio.TimeoutError, OSError, KeyError):  # retried later
                logger.debug("scattering weights version %d failed", version, exc_info=True)
                return

    async def unpublish(self, version: int, cluster: Cluster | None) -> None:
        """Take ``version`` back; its arrays become the spare of the next snapshot.
        ``cluster=None``: the client's cluster is gone, only local state is released."""
        fut = self.futures.pop(version, None)
        self._spare = self.snapshots.pop(version, None)
        self.segments.release(version)
        if self.in_store is not None:
            self.in_store.remove(version)
        IN_PROCESS_WEIGHTS.pop(self.name(version), None)
        if fut is None:
            return
        if cluster is not None:
            for name in (self.name(version), tree_name(self.name(version))):
                try:
                    await cluster.bounded("unpublishing weights",
                                          self.client.unpublish_dataset(name))
                except (KeyError, ClusterTimeoutError, OSError):
                    logger.debug("could not unpublish %s", name, exc_info=True)
        fut.release()

    async def close(self, cluster: Cluster | None) -> None:
        """Unpublish every version and remove every shared-memory segment."""
        for v in list(self.snapshots) + [v for v in self.futures if v not in self.snapshots]:
            await self.unpublish(v, cluster)
        self.segments.close()
        if self.in_store is not None:
            self.in_store.close()
