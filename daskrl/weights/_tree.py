"""The weights fan-out tree: hosts that hold a Dask-sent version serve it to hosts that do not.

The learner sends a version to one worker, its seed. Fetched from the seed alone, the time
until every host holds it grows with the hosts: the seed's link carries one copy per host.
Instead, the hosts form a binomial tree, as MPI's broadcast does: ranked when the version is
published (:func:`tree_hosts`, the seed's host first), host ``r`` fetches from host ``r`` less
its highest bit (:func:`parent_rank`), so the hosts that hold a version double at each round
and all ``H`` hold it after ``ceil(log2 H)`` rounds. Each host still receives one copy, and the
learner still sends one.

A host's first worker to need a version asks its parent host's worker in the tree (the
version's tree is published beside it, :func:`tree_name`). That worker serves it from its own
memory (the seed), its host's copy, or gets it first the same way, and sends it to one child at
a time, the lowest rank first (the one with the larger subtree), over the cluster's own comms
(``distributed.comm``: its TLS and serialization, worker to worker, no scheduler) with the
two-step handshake of Dask's ``get_data``. Whatever fails (the parent left, or does not answer
within the deadline) leaves the child to fetch the version from the seed through Dask, as
without a tree; the child checks the learner's checksums either way.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import dask.config
from distributed import Worker
from distributed.comm import get_address_host
from distributed.core import Status, send_recv
from distributed.protocol import to_serialize
from distributed.utils import sync

from daskrl.weights._snapshot import WeightsSnapshot

__all__ = ["TREE_OP", "fetch_from_tree", "parent_rank", "serve_weights", "stop_serving",
           "tree_enabled", "tree_hosts", "tree_name"]

logger = logging.getLogger(__name__)

TREE_OP = "daskrl_weights"
"""The worker handler that serves weights versions to child hosts."""

Provider = Callable[[int, str], WeightsSnapshot]
"""``(version, key) -> snapshot``: gets a version onto this worker's host if it is not there
yet, and returns it (blocking; raises if it cannot)."""

_PROVIDERS: weakref.WeakKeyDictionary[Worker, dict[str, Provider]] = \
    weakref.WeakKeyDictionary()
_TURNS: weakref.WeakKeyDictionary[Worker, _Turns] = weakref.WeakKeyDictionary()


def tree_enabled() -> bool:
    """Whether Dask-sent versions fan out in a tree (Dask config ``daskrl.weights.tree``,
    default True; False: every host fetches from the seed)."""
    return bool(dask.config.get("daskrl.weights.tree", True))


def tree_name(weights_name: str) -> str:
    """The name the tree of the version published as ``weights_name`` is published under."""
    return f"{weights_name}-tree"


def tree_hosts(workers: Iterable[str], seed: str) -> tuple[str, ...]:
    """One worker address per host, in tree order: the seed for its host first, then the
    lowest address of each other host, hosts by name."""
    by_host: dict[str, str] = {}
    for address in sorted(workers):
        by_host.setdefault(get_address_host(address), address)
    seed_host = get_address_host(seed)
    by_host.pop(seed_host, None)
    return (seed, *(by_host[h] for h in sorted(by_host)))


def parent_rank(rank: int) -> int:
    """The rank of the host that serves host ``rank`` (> 0): ``rank`` less its highest bit.
    Host ``r`` receives at round ``r.bit_length()``; its parent sends one child a round."""
    if rank <= 0:
        raise ValueError(f"host rank {rank} has no parent")
    return rank - (1 << (rank.bit_length() - 1))


def host_rank(tree: tuple[str, ...], address: str) -> int | None:
    """The rank of ``address``'s host in ``tree`` (None: its host joined after)."""
    host = get_address_host(address)
    for rank, member in enumerate(tree):
        if get_address_host(member) == host:
            return rank
    return None


class _Turns:
    """A worker's link: one child served at a time, the lowest rank first."""

    def __init__(self) -> None:
        self.busy = False
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    async def take(self, rank: int) -> None:
        if not self.busy:
            self.busy = True
            return
        turn = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (rank, next(self._order), turn))
        try:
            await turn
        except BaseException:
            if turn.done() and not turn.cancelled():
                self.give()  # handed the turn as it was given up: pass it on
            raise

    def give(self) -> None:
        while self._waiting:
            _, _, turn = heapq.heappop(self._waiting)
            if not turn.done():
                turn.set_result(None)
                return
        self.busy = False


def serve_weights(worker: Worker, plugin_name: str, provide: Provider) -> None:
    """Serve the versions of the collector ``plugin_name`` from ``worker`` to child hosts."""
    if TREE_OP not in worker.handlers:
        async def daskrl_weights(comm: Any, plugin: str, version: int, key: str,
                                 rank: int) -> Any:
            return await _serve(comm, plugin, version, key, rank, worker=worker)

        worker.handlers[TREE_OP] = daskrl_weights
    _PROVIDERS.setdefault(worker, {})[plugin_name] = provide


def stop_serving(worker: Worker, plugin_name: str) -> None:
    """Stop serving the collector ``plugin_name``'s versions from ``worker``."""
    _PROVIDERS.get(worker, {}).pop(plugin_name, None)


async def _serve(comm: Any, plugin: str, version: int, key: str, rank: int, *,
                 worker: Worker) -> Any:
    provide = _PROVIDERS.get(worker, {}).get(plugin)
    if provide is None:
        return {"status": "absent", "error": f"{worker.address} serves no collector {plugin!r}"}
    try:
        snap = await _in_thread(provide, version, key)
    except Exception as e:
        return {"status": "absent", "error": f"{type(e).__name__}: {e}"}
    turns = _TURNS.setdefault(worker, _Turns())
    await turns.take(rank)
    try:
        await comm.write({"status": "OK", "weights": to_serialize(snap)})
        await comm.read()  # the child's "OK": it has it all
    finally:
        turns.give()
    return Status.dont_reply


async def _in_thread(provide: Provider, version: int, key: str) -> WeightsSnapshot:
    """``provide(version, key)`` in a thread of its own: it blocks (on a parent, or on the
    host's copy another worker makes), and a process of many workers would exhaust a pool."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[WeightsSnapshot] = loop.create_future()

    def settle(result: WeightsSnapshot | None, error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result = provide(version, key)
        except BaseException as e:
            loop.call_soon_threadsafe(settle, None, e)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    threading.Thread(target=run, name="daskrl-weights-tree", daemon=True).start()
    return await done


def fetch_from_tree(worker: Worker, plugin_name: str, version: int, key: str,
                    tree: tuple[str, ...], timeout: float) -> WeightsSnapshot | None:
    """Version ``version`` (data key ``key``) from the parent of this worker's host in
    ``tree``, within ``timeout`` seconds; None where the tree cannot give it (this host is
    not in it, or the parent failed: fetch it from the seed)."""
    rank = host_rank(tree, worker.address)
    if rank is None:
        return None
    parent = tree[parent_rank(rank)] if rank else tree[0]
    if parent == worker.address:
        return None
    try:
        snap = sync(worker.loop, _ask, worker, parent, plugin_name, version, key, rank,
                    callback_timeout=timeout)
    except Exception as e:
        logger.info("%s: weights version %d from %s failed (%s: %s); fetching it from its "
                    "seed", worker.address, version, parent, type(e).__name__, e)
        return None
    if not isinstance(snap, WeightsSnapshot) or snap.version != version:
        logger.warning("%s: %s sent %r for weights version %d; fetching it from its seed",
                       worker.address, parent, type(snap).__name__, version)
        return None
    return snap


async def _ask(worker: Worker, parent: str, plugin: str, version: int, key: str,
               rank: int) -> Any:
    comm = await worker.rpc.connect(parent)
    comm.name = "daskrl weights tree"
    try:
        response = await send_recv(comm, op=TREE_OP, plugin=plugin, version=version, key=key,
                                   rank=rank)
        if response.get("status") != "OK":
            raise LookupError(response.get("error", response))
        await comm.write("OK")
        return response["weights"]
    except BaseException:  # cut short (a deadline): not a comm to use again
        comm.abort()
        raise
    finally:
        worker.rpc.reuse(parent, comm)
