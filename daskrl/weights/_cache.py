"""Getting a weights version into a worker's policy, from wherever the learner put it.

A batch names its weights version and where it is (:data:`WeightsRef`).  :class:`WeightsCache`
loads it from, in this order: the learner's own snapshot (in-process workers,
:data:`IN_PROCESS_WEIGHTS`), the learner's shared memory (a :class:`SharedWeights` manifest),
this worker's own memory (the broadcast seeded it here), this host's copy (another worker of
the host fetched it), or fetched (from the parent of this host in the version's fan-out tree,
:mod:`daskrl.weights._tree`, else through Dask) or read from the store (``weights_in_store``, a
:class:`StoreWeights` manifest) and then left as the host's copy.  Every path checks the
learner's checksums.  The cache also serves Dask-sent versions to the hosts below its own in a
tree (:meth:`WeightsCache.attach`).  It keeps the shared-memory mappings and the host copies
this worker made, until :meth:`WeightsCache.close`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from distributed import Client, Future, Worker

from daskrl._distributed import local_data, this_worker, worker_client
from daskrl.errors import WeightsNotSharedError, WeightsUnavailableError
from daskrl.weights._host_copies import HostCopies
from daskrl.weights._in_store import StoreWeights, read_store_weights
from daskrl.weights._segments import SharedWeights
from daskrl.weights._shared_reader import SharedWeightsReader
from daskrl.weights._snapshot import WeightsSnapshot, load_weights
from daskrl.weights._tree import fetch_from_tree, serve_weights, stop_serving, tree_name

if TYPE_CHECKING:
    from daskrl.store._store import TrajectoryStore

__all__ = ["IN_PROCESS_WEIGHTS", "WEIGHTS_FETCH_TIMEOUT", "WeightsCache", "WeightsRef",
           "weights_name"]

WEIGHTS_FETCH_TIMEOUT = 120.0
"""Default seconds a worker waits for a Dask-sent version (a lost one is scattered again)."""

PENDING_S = 2.0
"""Most seconds a fetched version's key may stay unknown to be held (it was lost, and the
learner scatters it again under a new key) before the worker asks for the name again."""

REFETCH_S = 0.25
"""Least seconds between two asks for a lost version (the learner scatters it again within
a health check)."""

IN_PROCESS_WEIGHTS: dict[str, WeightsSnapshot] = {}
"""Published weights by name, for workers that share the learner's process (``processes=False``):
they read the learner's snapshot in place. (Futures of in-process clusters are not serialized,
so a worker's client cannot resolve the published one.)"""

WeightsRef = str | SharedWeights | StoreWeights
"""How a task finds its weights version: the data key it was scattered under, or the manifest
of its copy in the learner's shared memory or in the store."""

SOURCES = ("in-process", "shared-memory", "seed", "host-copy", "tree", "dask", "store")
"""Where a version came from: the learner's snapshot in this process, the learner's shared
memory, this worker's own memory, another worker's copy on this host, fetched from the parent
of this host in the version's tree (:mod:`daskrl.weights._tree`), fetched through Dask from the
seed, or read from the store."""

Fetch = Callable[[], tuple[WeightsSnapshot, str]]
"""Gets a version to this worker: the snapshot, and where from (one of :data:`SOURCES`)."""


def weights_name(plugin_name: str, version: int) -> str:
    """Name under which a weights version is published (workers fetch it by this name)."""
    return f"{plugin_name}-weights-v{version}"


class WeightsCache:
    """One worker's means of loading weights versions, for the collector ``plugin_name``."""

    def __init__(self, plugin_name: str, where: str = "worker",
                 fetch_timeout: float = WEIGHTS_FETCH_TIMEOUT,
                 store: Callable[[], TrajectoryStore] | None = None) -> None:
        self.plugin_name = plugin_name
        self.store = store
        """The collector's store, for versions in it (opened on first use)."""
        self.where = where
        """How messages name this worker."""
        self.fetch_timeout = fetch_timeout
        self.sources: list[tuple[int, str]] = []
        """``(version, source)`` per version loaded, in order (see :data:`SOURCES`)."""
        self._worker_client: Client | None = None
        self.worker: Worker | None = None
        """The worker this cache serves versions from (:meth:`attach`)."""
        self.shared = SharedWeightsReader()  # mappings of the learner's shared-memory weights
        self.host_copies = HostCopies(plugin_name)  # this host's copies of Dask-sent versions

    def client(self) -> Client:
        """This worker's client, made once (see :func:`worker_client`): distributed's
        ``get_client`` sends the scheduler an event on every call."""
        if self._worker_client is None:
            self._worker_client = worker_client()
        return self._worker_client

    def load(self, policy: torch.nn.Module, version: int, weights: WeightsRef,
             fallback: bool = True) -> str:
        """Copy weights ``version`` into ``policy``; return where they came from.

        If shared memory cannot be read here, ``fallback`` looks for a published copy first
        (the learner may have switched to Dask transfers meanwhile; this needs a task thread).
        On an error, ``policy`` may hold a mix of versions.
        """
        name = weights_name(self.plugin_name, version)
        in_process = IN_PROCESS_WEIGHTS.get(name)
        if in_process is not None:
            load_weights(policy, in_process)
            source = "in-process"
        elif isinstance(weights, SharedWeights):
            try:
                self.shared.load(policy, weights, self.where)
                source = "shared-memory"
            except WeightsNotSharedError:
                # The learner switches to Dask transfers when it hears of this.
                if not fallback:
                    raise
                published = self.client().get_dataset(name, default=None)
                if published is None:
                    raise
                load_weights(policy, published.result(timeout=self.fetch_timeout))
                source = "dask"
        elif isinstance(weights, StoreWeights):
            source = self._load_per_host(policy, version,
                                         lambda: (self._read_store(weights), "store"))
        else:
            source = self._load_through_dask(policy, version, name, weights)
        self.sources.append((version, source))
        return source

    def _read_store(self, weights: StoreWeights) -> WeightsSnapshot:
        if self.store is None:
            raise WeightsUnavailableError(
                f"{self.where}: weights version {weights.version} is in the store, and this "
                "worker has none")
        return read_store_weights(self.store().backend, weights, self.where)

    def _load_through_dask(self, policy: torch.nn.Module, version: int, name: str,
                           key: str) -> str:
        """Load a version the learner sent through Dask: from this worker's memory (it is
        the version's seed), else as :meth:`_load_per_host` does, fetched from the parent of
        this host in the version's tree, or from a worker holding it."""
        # The worker's client, made at its first Dask-sent version even where it is the seed:
        # made later, as a seed dies, it can fail (see worker_client).
        self.client()
        local = local_data(this_worker(), key)
        if isinstance(local, WeightsSnapshot):
            load_weights(policy, local)
            return "seed"
        return self._load_per_host(policy, version,
                                   lambda: self._fetch_sent(version, name, key))

    def _load_per_host(self, policy: torch.nn.Module, version: int, fetch: Fetch) -> str:
        """Load ``version`` from this host's copy (another worker of the host got it), or
        ``fetch`` it and leave it as this host's copy; return where it came from."""
        held, source = self._hold(version, fetch)
        if isinstance(held, SharedWeights):
            try:
                self.shared.load(policy, held, self.where)
                return source
            except WeightsNotSharedError:  # removed meanwhile: fetch it
                held, source = fetch()
        load_weights(policy, held)  # verifies the learner's checksums
        return source

    def _hold(self, version: int,
              fetch: Fetch) -> tuple[SharedWeights | WeightsSnapshot, str]:
        """This host's copy of ``version`` (its manifest, ``"host-copy"``); or, where no
        worker of the host had one, the snapshot ``fetch`` got here (its checksums not checked
        yet) and where from, left as the host's copy."""
        copy_key = f"v{version}"
        copy = self.host_copies.manifest(copy_key, wait=False)
        claimed = copy is None and self.host_copies.claim(copy_key)
        if copy is None and not claimed:
            copy = self.host_copies.manifest(copy_key, wait=True)
        if copy is not None:
            return copy, "host-copy"
        try:
            snap, source = fetch()
        except BaseException:
            if claimed:
                self.host_copies.release(copy_key)
            raise
        if claimed:  # checks the checksums as it copies: a damaged one is not made the copy
            self.host_copies.publish(copy_key, snap)
        return snap, source

    def attach(self, worker: Worker) -> None:
        """Serve this collector's Dask-sent versions from ``worker`` to the hosts below its
        own in a version's tree (see :mod:`daskrl.weights._tree`)."""
        self.worker = worker
        serve_weights(worker, self.plugin_name, self._provide)

    def _provide(self, version: int, key: str) -> WeightsSnapshot:
        """Version ``version`` (data key ``key``) for a child host: from this worker's memory
        (the seed), this host's copy, or got here first."""
        assert self.worker is not None
        local = local_data(self.worker, key)
        if isinstance(local, WeightsSnapshot):
            return local
        name = weights_name(self.plugin_name, version)
        held, _ = self._hold(version, lambda: self._fetch_sent(version, name, key))
        if isinstance(held, SharedWeights):
            return self.shared.snapshot(held, self.where)
        return held

    def _fetch_sent(self, version: int, name: str, key: str) -> tuple[WeightsSnapshot, str]:
        """Fetch a Dask-sent version: from the parent of this host in its tree (``"tree"``),
        else from a worker holding it, the seed (``"dask"``): within ``fetch_timeout`` in
        all, half of it at most on the tree."""
        deadline = time.monotonic() + self.fetch_timeout
        tree = self.client().get_dataset(tree_name(name), default=None)
        if tree and self.worker is not None:
            snap = fetch_from_tree(self.worker, self.plugin_name, version, key, tuple(tree),
                                   timeout=self.fetch_timeout / 2)
            if snap is not None:
                return snap, "tree"
        return self._fetch(version, name, deadline), "dask"

    def _fetch(self, version: int, name: str, deadline: float) -> WeightsSnapshot:
        """Fetch the published weights ``name`` by ``deadline`` (``time.monotonic()``); wait
        out a re-publication if they were lost."""
        client = self.client()
        while True:
            # A published dataset: the scheduler registers this worker's client as wanting the
            # key, and the data comes straight from a worker holding it.
            fut: Future | None = client.get_dataset(name, default=None)
            if fut is None:
                raise WeightsUnavailableError(
                    f"{self.where}: weights version {version} ({name!r}) is no longer "
                    "published; was the collector closed?"
                )
            asked = time.monotonic()
            try:
                # Its key must be known held within PENDING_S (a key the scheduler forgot
                # stays pending); then the transfer has all the time left: cut short, a big
                # version on a slow link would start again, and never arrive.
                while fut.status == "pending" and time.monotonic() - asked < PENDING_S:
                    time.sleep(0.005)
                if fut.status != "finished":  # pending still, lost, cancelled
                    raise LookupError(f"{name!r} is {fut.status} on the scheduler")
                snap = fut.result(timeout=max(0.1, deadline - time.monotonic()))
            except Exception as e:
                # Lost with the worker that held it: the learner scatters it again under
                # the same name. Let go of the lost key at once (a client that keeps wanting
                # a key the scheduler forgot is told so on every reconnection), and do not
                # ask the scheduler again at once: a lost key fails in milliseconds.
                fut.release()
                if time.monotonic() > deadline:
                    raise WeightsUnavailableError(
                        f"{self.where} could not fetch weights version {version} within "
                        f"{self.fetch_timeout:.0f}s; is the learner alive?"
                    ) from e
                time.sleep(max(0.0, REFETCH_S - (time.monotonic() - asked)))
                continue
            if not isinstance(snap, WeightsSnapshot):
                raise WeightsUnavailableError(
                    f"{self.where}: {name!r} holds a {type(snap).__name__}, not weights "
                    f"version {version}; was another collector given the same name?"
                )
            return snap

    def close(self) -> None:
        """Drop every mapping, remove the host copies this worker made, and stop serving."""
        if self.worker is not None:
            stop_serving(self.worker, self.plugin_name)
        self.shared.close()
        self.host_copies.close()
