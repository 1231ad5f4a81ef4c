"""Batch handles: the small, picklable records that travel back to the learner.

A handle names its store by URL (:attr:`BatchHandle.store_url`) and carries no credentials: a
store that needs ``storage_options`` is read through its store object.  A handle a collector
hands over keeps a reference to the collector's store in this process (never pickled, never
compared), so ``handle.load()`` works there; elsewhere pass ``store=`` (or
``store.load(handle)``).

This module does not import the store: a handle reads through any :class:`ReadingStore`, and
opens one from its URL with the opener :mod:`daskrl.store._store` registers when imported
(:func:`register_store_opener`).  The names a handle is imported and unpickled by,
``daskrl.store.BatchHandle`` (its ``__module__``) and ``daskrl.store._handles.BatchHandle``
(in pickles of earlier releases), both import the store module first, so a handle unpickled
in a fresh process finds the opener.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn, Protocol

import torch

from daskrl.errors import InternalError, StoreOptionsRequiredError, UsageError

__all__ = ["BatchHandle", "ReadingStore", "StoreOpener", "register_store_opener"]


class ReadingStore(Protocol):
    """What a handle reads its batch through (:class:`~daskrl.TrajectoryStore` is one)."""

    @property
    def url(self) -> str:
        """The store's normalized URL."""

    def load(self, batch: BatchHandle, device: torch.device | str | None = None,
             keys: Sequence[str] | None = None) -> dict[str, Any]:
        """The batch of ``batch`` as ``{key: tensor [T, E, ...]}`` on ``device``."""


StoreOpener = Callable[[str, Mapping[str, Any] | None], ReadingStore]
"""Opens the store at a URL with ``storage_options`` (``None``: none)."""

_opener: StoreOpener | None = None


def register_store_opener(opener: StoreOpener) -> None:
    """Make ``opener`` the way a handle opens its store from its URL (the store module
    registers :class:`~daskrl.TrajectoryStore` when it is imported)."""
    global _opener
    _opener = opener


@dataclasses.dataclass(frozen=True)
class BatchHandle:
    """Where a committed batch lives and what it holds; carries no data and no credentials."""

    store_url: str
    """URL of the store (``file:///...``, ``s3://...``, ``memory://...``)."""
    batch_id: int
    """Unique within the store."""
    frames: int
    """Env steps in the batch (``T * E``)."""
    weights_version: int
    """Weights version the batch's actions were computed with."""
    policy_lag: int
    """The learner's newest version when the handle was handed over, minus ``weights_version``."""
    worker: str
    """Address of the worker that wrote the batch."""
    device: str
    """Device the policy ran on (``"cpu"``, ``"cuda:0"``, ...)."""
    episode_returns: tuple[float, ...]
    """Returns of the episodes that finished in this batch."""
    episode_lengths: tuple[int, ...]
    """Lengths of the episodes that finished in this batch."""
    path: str
    """Group of the batch's arrays inside the store."""
    shape: tuple[int, int] = (0, 0)
    """``(T, E)``."""
    rollout_seconds: float = 0.0
    """Time the worker spent stepping envs and the policy."""
    write_seconds: float = 0.0
    """Time the worker spent writing and committing the batch."""
    env_restarts: int = 0
    """Times the batch's envs were rebuilt after an env error (``on_env_error="restart"``)."""
    episode_stats: tuple[tuple[float, int, float], ...] = ()
    """``(r, l, t)`` of each episode that ``gymnasium.wrappers.RecordEpisodeStatistics`` reported
    in this batch (its ``info["episode"]``: return, length, seconds), in the order they ended,
    as :attr:`episode_returns`; empty when the env is not wrapped so."""
    needs_options: bool = False
    """The store was opened with ``storage_options`` (which the handle does not carry): load
    it through its store object."""
    env: int = 0
    """Index of the env the batch was collected from, in its run's ``settings["envs"]`` (0
    unless the collection had several envs; ``store.handles(env=...)`` selects by it)."""
    _store_object: ReadingStore | None = dataclasses.field(default=None, repr=False,
                                                           compare=False)
    """The store object of the collector that handed the handle over (this process only)."""

    def __getstate__(self) -> dict[str, Any]:  # the store object stays in this process
        state = dict(self.__dict__)
        state["_store_object"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "store" in state:  # pickled when the URL's field was named ``store``
            state = {"store_url": state["store"], **state}
            del state["store"]
        self.__dict__.update(state)

    @property
    def store(self) -> str:
        """Deprecated name of :attr:`store_url` (``load(store=...)`` takes a store object)."""
        warnings.warn("BatchHandle.store is deprecated: it is the store's URL, now named "
                      "BatchHandle.store_url.", DeprecationWarning, stacklevel=2)
        return self.store_url

    def to_wire(self) -> tuple[Any, ...]:
        """The handle's fields as plain values (msgpack's types), in field order: what a
        stream sends the learner, at a tenth of pickling's cost (no store object)."""
        state = self.__dict__
        return tuple(state[name] for name in _WIRE_FIELDS)

    @classmethod
    def from_wire(cls, values: Sequence[Any]) -> BatchHandle:
        """The handle :meth:`to_wire` gave ``values`` of."""
        if len(values) != len(_WIRE_FIELDS):
            raise ValueError(f"a handle has {len(_WIRE_FIELDS)} fields, got {len(values)} "
                             "values (a worker of another daskrl version?)")
        new = object.__new__(cls)
        new.__dict__.update(zip(_WIRE_FIELDS, values), _store_object=None)
        return new

    def with_store(self, store: ReadingStore) -> BatchHandle:
        """The handle, loading through ``store`` (this process only: not pickled)."""
        return self._evolve(_store_object=store)

    def _evolve(self, **changes: Any) -> BatchHandle:
        """``dataclasses.replace(self, **changes)`` without running ``__init__`` again (the
        learner evolves every handle it hands over, and a copy of the fields costs a fraction
        of ``__init__``; a handle has no ``__post_init__`` to skip)."""
        if not changes.keys() <= _FIELDS:
            raise TypeError(f"BatchHandle has no fields {sorted(changes.keys() - _FIELDS)}")
        new = object.__new__(type(self))
        state = new.__dict__
        state.update(self.__dict__)
        state.update(changes)
        return new

    @property
    def fps(self) -> float:
        """Frames per second of the rollout on its worker (store writes excluded)."""
        return self.frames / self.rollout_seconds if self.rollout_seconds > 0 else float("nan")

    def load(
        self,
        device: torch.device | str | None = None,
        keys: Sequence[str] | None = None,
        storage_options: Mapping[str, Any] | None = None,
        *,
        store: ReadingStore | None = None,
        **removed: Any,
    ) -> dict[str, Any]:
        """Read the batch from the store as ``{key: tensor [T, E, ...]}`` on ``device``.

        The arrays of a ``Dict`` or ``Tuple`` space and of ``info`` come nested:
        ``batch["observation"]["desired_goal"]``, ``batch["observation"][0]`` (a tuple),
        ``batch["info"]["lives"]``; ``keys`` may name such a group (``"observation"``,
        ``"info"``) or one of its arrays (``"observation/desired_goal"``).

        ``store``: the store object to read through (e.g. ``collector.store``, or
        ``open_store(url, storage_options)``), required when the store needs
        ``storage_options`` (:class:`~daskrl.StoreOptionsRequiredError` otherwise) unless
        they are given as ``storage_options``.  A store that needs none (a local path) is
        opened from the handle's URL.

        As one ``tensordict.TensorDict``:
        ``daskrl.integrations.torchrl.to_tensordict(handle.load())`` (the ``daskrl[torchrl]``
        extra; TorchRL's layout: :func:`daskrl.integrations.torchrl.to_torchrl`).
        """
        if removed:
            _refuse_removed(removed)
        return self._store_for(
            store, storage_options,
            ". Load it through its store: handle.load(store=collector.store) or "
            "open_store(url, storage_options).load(handle) (or pass "
            "handle.load(storage_options=...))."
        ).load(self, device, keys)

    def _store_for(self, store: ReadingStore | None,
                   storage_options: Mapping[str, Any] | None, hint: str) -> ReadingStore:
        """The store to read this batch from: ``store``, the one the handle came with, or one
        opened from its URL with ``storage_options`` (``hint``: what to do if it needs them)."""
        if store is None and storage_options is None:
            store = self._store_object
        if store is not None:
            if storage_options is not None:
                raise UsageError("pass store= or storage_options=, not both: the store object "
                                 "has its own storage_options.")
            return store
        if storage_options is None and self.needs_options:
            raise StoreOptionsRequiredError(
                f"batch {self.batch_id} is in the store {self.store_url!r}, which needs "
                f"storage_options, and a handle carries none{hint}")
        if _opener is None:
            raise InternalError("no store opener is registered: daskrl.store._store registers "
                                "one when imported, which every public way to BatchHandle does.")
        return _opener(self.store_url, storage_options)

    def reading_store(self, store: ReadingStore | None = None,
                      storage_options: Mapping[str, Any] | None = None) -> ReadingStore:
        """The store :meth:`load` reads this batch from: ``store``, the one the handle came
        with, or one opened from the handle's URL with ``storage_options``."""
        return self._store_for(store, storage_options,
                               ": pass store= (e.g. collector.store) or storage_options=.")

    def to_xarray(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Moved: ``daskrl.data.batch_to_xarray(handle, ...)``, with the same parameters."""
        raise UsageError("handle.to_xarray(...) moved to the readers' package, which the store "
                         "does not depend on: use daskrl.data.batch_to_xarray(handle, ...), "
                         "with the same parameters.")

    def record(self) -> dict[str, Any]:
        """Plain-JSON metadata, as stored in the batch's commit record."""
        skip = {"store_url", "policy_lag", "write_seconds", "needs_options", "_store_object"}
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
             if f.name not in skip}
        d["episode_returns"] = list(self.episode_returns)
        d["episode_lengths"] = list(self.episode_lengths)
        d["shape"] = list(self.shape)
        d["episode_stats"] = [list(s) for s in self.episode_stats]
        return d

    @classmethod
    def from_record(cls, store_url: str, rec: Mapping[str, Any], policy_lag: int = 0, *,
                    needs_options: bool = False) -> BatchHandle:
        """Rebuild a handle of the store at ``store_url`` from a commit record
        (``needs_options``: the store has ``storage_options``)."""
        names = {f.name for f in dataclasses.fields(cls)} - {"store_url", "needs_options",
                                                            "_store_object"}
        kw = {k: v for k, v in rec.items() if k in names}
        kw["episode_returns"] = tuple(kw.get("episode_returns", ()))
        kw["episode_lengths"] = tuple(kw.get("episode_lengths", ()))
        kw["shape"] = tuple(kw.get("shape", (0, 0)))
        kw["episode_stats"] = tuple((float(r), int(n), float(s))
                                    for r, n, s in kw.get("episode_stats", ()))
        return cls(store_url=store_url, policy_lag=policy_lag, needs_options=needs_options, **kw)


BatchHandle.__module__ = "daskrl.store"  # the name pickles use: its import imports the store

_FIELDS = frozenset(f.name for f in dataclasses.fields(BatchHandle))


def _refuse_removed(arguments: Mapping[str, Any]) -> None:
    """Say what replaced a keyword ``load`` no longer takes, or that it takes no such one."""
    if "as_tensordict" in arguments:
        raise UsageError(
            "handle.load(as_tensordict=True) was removed (the store does not depend on its "
            "integrations): use daskrl.integrations.torchrl.to_tensordict(handle.load(...)), "
            "which gives the same TensorDict.")
    raise TypeError(f"BatchHandle.load() got unexpected keyword arguments {sorted(arguments)}")
_WIRE_FIELDS = tuple(f.name for f in dataclasses.fields(BatchHandle) if f.name != "_store_object")
