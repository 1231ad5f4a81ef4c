"""Whole episodes, reassembled from the batches they span (a stream's envs continue across
its batches), read in batch-id order holding only the open episodes' rows."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from daskrl._nested import nest
from daskrl.data._state import is_state, per_batch
from daskrl.errors import ArrayNotFoundError, BatchNotFoundError, ConfigError, StoreFormatError
from daskrl.store import run_of

if TYPE_CHECKING:
    from daskrl.store import EnvFilter, TrajectoryStore

__all__ = ["Episode", "episodes", "iter_episodes"]

_EPISODE_KEYS = ("episode_id", "terminated", "truncated")
_NEEDED = (*_EPISODE_KEYS, "step")
"""The arrays episodes are reassembled from, which every batch of a collector holds."""


@dataclasses.dataclass(frozen=True)
class Episode:
    """One episode reassembled from the batches it spans, time-major ``[L, ...]``."""

    episode_id: int
    data: dict[str, Any]
    """``{key: tensor [L, ...]}``, rows in the episode's order (the arrays of a ``Dict`` or
    ``Tuple`` space and of ``info`` nested, as :meth:`~daskrl.TrajectoryStore.load` gives
    them)."""
    batch_ids: tuple[int, ...]
    """The batches it spans, in order."""
    complete: bool
    """It has every step from 0 on and ended with ``terminated`` or ``truncated``; False: cut
    (see the store format), or some of its batches were deleted."""

    @property
    def length(self) -> int:
        return int(self.data["episode_id"].shape[0])

    @property
    def total_reward(self) -> float:
        """Sum of rewards (float64); NaN when ``reward`` was not loaded."""
        r = self.data.get("reward")
        return float(r.double().sum()) if r is not None else float("nan")


def episodes(
    store: TrajectoryStore,
    keys: Sequence[str] | None = None,
    *,
    complete_only: bool = True,
    device: torch.device | str | None = None,
    env: EnvFilter = None,
) -> Iterator[Episode]:
    """Yield the whole episodes of ``store``, reassembled across the batches they span (see
    :func:`iter_episodes` for ``complete_only``); ``env``: only those of the env(s) selected
    as in :meth:`~daskrl.TrajectoryStore.handles` (a stream collects one env, so its episodes
    stay whole)."""
    return iter_episodes(store, keys, complete_only=complete_only, device=device, env=env)


def iter_episodes(
    store: TrajectoryStore,
    keys: Sequence[str] | None = None,
    *,
    complete_only: bool = True,
    device: torch.device | str | None = None,
    only_runs: Collection[int] | None = None,
    env: EnvFilter = None,
) -> Iterator[Episode]:
    """Yield whole episodes, reassembled across the batches they span.

    A stream's envs continue across its batches, so an episode may start in one batch and
    end several batches later; its rows share one ``episode_id`` and are ordered by
    ``(batch_id, t)``.  Episodes are yielded as they end, reading batches in id order and
    holding only the open episodes' rows in memory.

    A recurrent policy's ``is_init`` and a ``policy_state`` stored before every step come as
    any array, ``[L, ...]``.  A ``policy_state`` stored once per batch (``[E, ...]``) is left
    out: the state an episode starts from is the policy's initial state (``is_init`` marks
    its first row), and the state before a later row is not stored; naming it in ``keys``
    raises :class:`~daskrl.ConfigError` for such a batch.

    Parameters
    ----------
    keys
        Arrays to include (``episode_id``, ``terminated`` and ``truncated`` always are).
    complete_only
        Yield only complete episodes: every step from 0 on, ending with ``terminated`` or
        ``truncated``.  With False, the others come too, with ``complete=False``: episodes
        cut without a flag (``reset_at_each_iter``, rebuilt envs, a missing later batch, the
        end of their run's batches: a crashed or resumed run, or still running at the newest
        batch) and episodes whose first or middle steps were in deleted batches
        (``keep_last``, ``delete_batches``).  No episode spans two runs.
    device
        Device of the yielded tensors.
    only_runs
        Read only these runs' batches (an episode never spans runs); None: all.
    env
        Read only the batches of these envs (as ``store.handles(env=...)`` selects them; a
        stream's batches all come from one env); None: all.
    """
    need = None if keys is None else list(dict.fromkeys([*keys, *_NEEDED]))
    drop_step = keys is not None and "step" not in keys
    runs = store.runs()
    records = store.records()
    ids = list(records) if env is None else [h.batch_id for h in store.handles(env=env)]
    asked_state = keys is not None and any(is_state(k) for k in keys)
    open_eps: dict[int, list[tuple[int, dict[str, torch.Tensor]]]] = {}
    last_seen: dict[int, int] = {}
    dev = torch.device(device) if device is not None else None

    def emit(eid: int, ended: bool) -> Episode:
        pieces = open_eps.pop(eid)
        last_seen.pop(eid, None)
        # Whole only if its steps run 0, 1, 2, ...: a deleted batch leaves a hole.
        steps = torch.cat([p["step"] for _, p in pieces])
        complete = ended and torch.equal(steps, torch.arange(len(steps), dtype=steps.dtype))
        if drop_step:
            pieces = [(b, {k: v for k, v in p.items() if k != "step"}) for b, p in pieces]
        names = pieces[0][1].keys()
        data = {k: torch.cat([p[k] for _, p in pieces]) if len(pieces) > 1
                else pieces[0][1][k].clone() for k in names}  # own memory, contiguous
        if dev is not None:
            data = {k: v.to(dev) for k, v in data.items()}
        bids = tuple(dict.fromkeys(b for b, _ in pieces))
        return Episode(int(eid), nest(data), bids, complete)

    current_run = None
    for bid in ids:
        if run_of(bid) != current_run:
            # No episode continues into another run (a resumed run starts its envs afresh):
            # those still open when their run's batches end were cut there.
            current_run = run_of(bid)
            for i in sorted(open_eps):
                ep = emit(i, False)
                if not complete_only:
                    yield ep
        if only_runs is not None and run_of(bid) not in only_runs:
            continue
        try:
            batch = store.load(bid, keys=need, flat=True)
        except BatchNotFoundError:
            continue
        except ArrayNotFoundError:
            _check_episode_arrays(store, bid, store.array_names(store.handle(bid).path))
            raise  # an array of keys=
        _check_episode_arrays(store, bid, batch)
        if bid in records and per_batch(records[bid]):
            if asked_state:
                raise ConfigError(
                    f"episodes() cannot give keys={list(keys or ())}: batch {bid} of store "
                    f"{store.url!r} stores policy_state once, before its first step, not per "
                    "step. An episode starts from the policy's initial state (is_init marks "
                    "its first row); collect with store_policy_state='every_step' for the "
                    "state before every step, or read it with store.load().")
            batch = {k: v for k, v in batch.items() if not is_state(k)}
        eid = batch["episode_id"].numpy()
        done = (batch["terminated"] | batch["truncated"]).numpy()
        T, E = eid.shape[:2]
        for e in range(E):
            col = eid[:, e]
            starts = np.flatnonzero(np.r_[True, col[1:] != col[:-1]])
            ends = np.r_[starts[1:], T]
            for a, b in zip(starts.tolist(), ends.tolist()):
                i = int(col[a])
                open_eps.setdefault(i, []).append((bid, {k: v[a:b, e] for k, v in batch.items()}))
                last_seen[i] = bid
                if done[b - 1, e]:
                    ep = emit(i, True)
                    if ep.complete or not complete_only:
                        yield ep
        settings = runs.get(run_of(bid), {}).get("settings", {})
        for i in [i for i, b in last_seen.items() if b == bid]:
            if settings.get("reset_at_each_iter"):  # every open episode was cut here
                ep = emit(i, False)
                if not complete_only:
                    yield ep
            else:  # copy this batch's rows so the batch's tensors can be freed
                b0, piece = open_eps[i][-1]
                open_eps[i][-1] = (b0, {k: v.clone() for k, v in piece.items()})
    for i in sorted(open_eps):
        ep = emit(i, False)
        if not complete_only:
            yield ep


def _check_episode_arrays(store: TrajectoryStore, bid: int, names: Collection[str]) -> None:
    """Raise :class:`~daskrl.StoreFormatError` unless batch ``bid`` has every array episodes
    are reassembled from."""
    missing = [k for k in _NEEDED if k not in names]
    if missing:
        raise StoreFormatError(
            f"batch {bid} of store {store.url!r} has no {missing} array(s), which episodes are "
            f"reassembled from (every batch a collector writes has {list(_NEEDED)}): it was "
            f"not written by daskrl's collector, or it is damaged. Read it with "
            f"store.load({bid}), or delete it: "
            f"open_store(url, writable=True).delete_batches([{bid}]).")
