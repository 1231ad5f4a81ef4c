"""The episode-continuity checker: every episode continuous across batches."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

# -- episode continuity ---------------------------------------------------------------------------
_CONTINUITY_KEYS = ("episode_id", "step", "terminated", "truncated", "observation",
                    "next_observation")


@dataclasses.dataclass(frozen=True)
class ContinuityReport:
    """What :func:`check_episode_continuity` checked."""

    batches: int
    transitions: int
    episodes: int
    """Distinct episode ids."""
    ended: int
    """Episodes that ended with ``terminated`` or ``truncated``."""
    cut: int
    """Episodes that stop at a batch's last step without a flag (cut, or still running)."""


@dataclasses.dataclass
class _Open:
    batch_id: int
    env: int
    step: int
    next_obs: np.ndarray


def _rows(batch: dict[str, np.ndarray], key: str) -> np.ndarray:
    """Array ``key`` of a batch; for a Dict or Tuple space (``key/...`` arrays), the bytes of
    all its arrays per row ``[T, E, n]``, which compare equal exactly when every entry does."""
    if key in batch:
        return batch[key]
    leaves = [a for n, a in sorted(batch.items()) if n.startswith(key + "/")]
    T, E = leaves[0].shape[:2]
    return np.concatenate([np.ascontiguousarray(a).reshape(T, E, -1).view(np.uint8)
                           for a in leaves], axis=2)


def check_episode_continuity(store: Any, max_problems: int = 20) -> ContinuityReport:
    """Check every episode of ``store`` is continuous; raise ``AssertionError`` listing the
    first ``max_problems`` breaks.

    The rules (``docs/store-format.md``, *Transitions and episodes*), for a store from which
    nothing was deleted: an episode's rows are one env column; its ``step`` runs 0, 1, 2, ...;
    its first row is at ``t = s`` in the batch its id names (``episode_id =
    episode_id_base(batch_id) + s * E + e``), or at ``t = 0`` of that batch's stream successor when ``s == T``; only its
    last row may be ``terminated`` or ``truncated``; within a batch ``observation[t + 1] ==
    next_observation[t]``; it continues into a later batch only from that batch's last step,
    at ``t = 0`` of the stream's next committed batch (when records name their stream), with
    ``observation`` equal to the last ``next_observation``. An episode that stops at a batch's
    last step without a flag is cut (or still running), which the format allows.
    """
    from daskrl.store._layout import episode_origin, run_of

    records = store.records()
    ids = sorted(records)
    # The committed batch before each batch in its stream (when records name their stream).
    stream_prev: dict[int, int | None] = {}
    last_of_stream: dict[int, int] = {}
    for bid in ids:
        stream = records[bid].get("stream")
        if isinstance(stream, int):
            key = run_of(bid) * 1_000_000 + stream  # streams are per run
            stream_prev[bid] = last_of_stream.get(key)
            last_of_stream[key] = bid
    problems: list[str] = []
    shapes: dict[int, tuple[int, int]] = {}
    ended_last: dict[int, np.ndarray] = {}  # env columns whose episode ended at the last step
    open_eps: dict[int, _Open] = {}
    seen: set[int] = set()
    transitions = ended = 0

    def bad(msg: str) -> None:
        problems.append(msg)

    for bid in ids:
        b = {k: v.numpy() for k, v in store.load(bid, keys=list(_CONTINUITY_KEYS), flat=True).items()}
        eid, step = b["episode_id"], b["step"]
        obs, nxt = _rows(b, "observation"), _rows(b, "next_observation")
        done = b["terminated"] | b["truncated"]
        T, E = eid.shape[:2]
        shapes[bid] = (T, E)
        ended_last[bid] = done[T - 1].copy()
        transitions += T * E
        for e in range(E):
            col = eid[:, e]
            starts = np.flatnonzero(np.r_[True, col[1:] != col[:-1]])
            for a, z in zip(starts.tolist(), [*starts[1:].tolist(), T]):
                i = int(col[a])
                where = f"episode {i} (batch {bid}, env {e}, t={a})"
                st = step[a:z, e]
                if not np.array_equal(st, np.arange(st[0], st[0] + (z - a))):
                    bad(f"{where}: steps {st.tolist()} are not consecutive")
                if z - a > 1 and not np.array_equal(obs[a + 1:z, e], nxt[a:z - 1, e]):
                    bad(f"{where}: observation[t + 1] != next_observation[t] inside the batch")
                if done[a:z - 1, e].any():
                    bad(f"{where}: rows follow a terminated/truncated step under the same id")
                if a > 0 and not done[a - 1, e]:
                    bad(f"{where}: a new episode starts at t={a} although the one before "
                        "it did not end")
                if int(st[0]) == 0:
                    if i in seen:
                        bad(f"{where}: episode id used twice")
                    origin, rest = episode_origin(i)
                    s, env = divmod(rest, E)
                    if env != e:
                        bad(f"{where}: its id names env {env}")
                    elif origin == bid:
                        if s != a:
                            bad(f"{where}: its id names t={s}")
                    elif origin not in shapes:
                        bad(f"{where}: its id names batch {origin}, which is not in the store "
                            "before it")
                    elif a != 0 or s != shapes[origin][0] or not ended_last[origin][e]:
                        bad(f"{where}: its id names batch {origin} t={s}, but the env did not "
                            f"end an episode at the last step of batch {origin} there")
                    elif bid in stream_prev and stream_prev[bid] != origin:
                        bad(f"{where}: its id names batch {origin}, which is not the batch "
                            f"before {bid} in its stream ({stream_prev[bid]})")
                else:
                    prev = open_eps.pop(i, None)
                    if prev is None:
                        bad(f"{where}: starts at step {int(st[0])}; its first steps are in no "
                            "batch")
                    elif a != 0 or prev.env != e or prev.step + 1 != int(st[0]):
                        bad(f"{where}: continues episode {i} (last seen at step {prev.step}, "
                            f"env {prev.env}, batch {prev.batch_id}) out of order")
                    elif bid in stream_prev and stream_prev[bid] != prev.batch_id:
                        bad(f"{where}: continues from batch {prev.batch_id}, which is not the "
                            f"batch before {bid} in its stream ({stream_prev[bid]})")
                    elif not np.array_equal(obs[0, e], prev.next_obs):
                        bad(f"{where}: its observation is not the next_observation its "
                            f"previous step in batch {prev.batch_id} ended with")
                seen.add(i)
                if done[z - 1, e]:
                    ended += 1
                elif z == T:
                    open_eps[i] = _Open(bid, e, int(st[-1]), nxt[T - 1, e].copy())
                else:
                    bad(f"{where}: stops at t={z - 1} without an end, inside the batch")
    if problems:
        more = f" (and {len(problems) - max_problems} more)" if len(problems) > max_problems else ""
        raise AssertionError(f"store {store.url!r}: episodes are not continuous{more}:\n  "
                             + "\n  ".join(problems[:max_problems]))
    return ContinuityReport(len(ids), transitions, len(seen), ended, len(open_eps))
