"""A store at a glance: counts, returns, versions, bytes on disk (its plot: :mod:`._plot`).

Used by ``daskrl inspect URL``; works on any store :func:`daskrl.open_store` opens.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from daskrl.store import ATTEMPT_NAME

if TYPE_CHECKING:
    from daskrl.store import TrajectoryStore

__all__ = ["format_summary", "summarize"]


def _returns(records: dict[int, dict[str, Any]]) -> np.ndarray:
    """The return of every episode that ended, in batch-id order."""
    return np.asarray([float(r) for rec in records.values()
                       for r in rec.get("episode_returns") or []], np.float64)


def summarize(store: TrajectoryStore) -> dict[str, Any]:
    """Summary of a :class:`~daskrl.TrajectoryStore` as plain JSON-able values."""
    records = store.records()
    # bytes: one listing of batches/ gives every attempt's size
    committed_paths = {r["path"] for r in records.values()}
    attempts = store.attempt_sizes()
    stored = sum(size for path, (size, _) in attempts.items() if path in committed_paths)
    garbage = sum(size for path, (size, _) in attempts.items()
                  if path not in committed_paths and ATTEMPT_NAME.fullmatch(path.split("/")[1]))
    chunks = raw = 0
    pruned = []
    for bid, rec in records.items():
        sizes = store.batch_sizes(bid, rec["path"])
        if sizes is None:
            pruned.append(bid)  # deleted since it was listed: not counted
            continue
        chunks += sizes[0]
        raw += sizes[1]
    if pruned:  # the counts describe the batches that are still there
        records = {b: r for b, r in records.items() if b not in set(pruned)}
    returns = _returns(records)
    versions = sorted({int(r["weights_version"]) for r in records.values()})
    lengths = [int(n) for r in records.values() for n in (r.get("episode_lengths") or [])]
    skipped = store.skipped_records()
    last = returns[-100:]
    return {
        "store": store.url,
        "runs": len(store.runs()),
        "batches": len(records),
        "frames": sum(int(r["frames"]) for r in records.values()),
        "episodes": int(returns.size),
        "return_mean": float(returns.mean()) if returns.size else math.nan,
        "return_std": float(returns.std()) if returns.size else math.nan,
        "return_min": float(returns.min()) if returns.size else math.nan,
        "return_max": float(returns.max()) if returns.size else math.nan,
        "return_mean_last_100": float(last.mean()) if last.size else math.nan,
        "episode_length_mean": float(np.mean(lengths)) if lengths else math.nan,
        "weights_versions": len(versions),
        "weights_version_min": versions[0] if versions else None,
        "weights_version_max": versions[-1] if versions else None,
        "workers": len({r["worker"] for r in records.values()}),
        "bytes_on_disk": stored,
        "bytes_uncompressed": raw,
        "bytes_of_chunks": chunks,
        "compression_ratio": raw / chunks if chunks else math.nan,
        "garbage_bytes": garbage,
        "skipped_records": len(skipped),
    }


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def format_summary(s: dict[str, Any]) -> str:
    """Human-readable lines of a :func:`summarize` result."""
    def num(v: float) -> str:
        return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}"

    versions = ("none" if s["weights_versions"] == 0 else
                f"{s['weights_versions']} ({s['weights_version_min']}..{s['weights_version_max']})")
    return "\n".join([
        f"store:             {s['store']}",
        f"runs:              {s['runs']}",
        f"batches:           {s['batches']}",
        f"frames:            {s['frames']}",
        f"episodes:          {s['episodes']} ended (mean length {num(s['episode_length_mean'])})",
        f"returns:           mean {num(s['return_mean'])}, std {num(s['return_std'])}, "
        f"min {num(s['return_min'])}, max {num(s['return_max'])}, "
        f"mean of last 100 {num(s['return_mean_last_100'])}",
        f"weights versions:  {versions}",
        f"workers:           {s['workers']}",
        f"bytes on disk:     {_size(s['bytes_on_disk'])} "
        f"(chunks {_size(s['bytes_of_chunks'])} of {_size(s['bytes_uncompressed'])} "
        f"uncompressed: compression ratio {num(s['compression_ratio'])})",
        f"garbage:           {_size(s['garbage_bytes'])} (remove with: daskrl gc URL)",
        *([f"unreadable:        {s['skipped_records']} records skipped (damaged or not "
           "daskrl's; listed by store.skipped_records())"] if s.get("skipped_records") else []),
    ])
