"""Batch handles: the small, picklable records that travel back to the learner."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["BatchHandle"]


@dataclasses.dataclass(frozen=True)
class BatchHandle:
    """Where a committed batch lives and what it holds; carries no data and no credentials."""

    store: str
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

    @property
    def fps(self) -> float:
        """Frames per second of the rollout on its worker (store writes excluded)."""
        return self.frames / self.rollout_seconds if self.rollout_seconds > 0 else float("nan")

    def load(
        self,
        device: torch.device | str | None = None,
        keys: Sequence[str] | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Read the batch from the store as ``{key: tensor [T, E, ...]}`` on ``device``.

        ``storage_options`` default to those the collector or ``open_store`` used for this URL
        in this process.
        """
        from daskrl.store._store import TrajectoryStore, options_for

        opts = storage_options if storage_options is not None else options_for(self.store)
        return TrajectoryStore(self.store, opts).load_path(self.path, device, keys, self.batch_id)

    def record(self) -> dict[str, Any]:
        """Plain-JSON metadata, as stored in the batch's commit record."""
        d = dataclasses.asdict(self)
        for k in ("store", "policy_lag", "write_seconds"):
            d.pop(k)
        d["episode_returns"] = list(self.episode_returns)
        d["episode_lengths"] = list(self.episode_lengths)
        d["shape"] = list(self.shape)
        return d

    @classmethod
    def from_record(cls, store: str, rec: Mapping[str, Any], policy_lag: int = 0) -> BatchHandle:
        """Rebuild a handle from a commit record."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in rec.items() if k in names}
        kw["episode_returns"] = tuple(kw.get("episode_returns", ()))
        kw["episode_lengths"] = tuple(kw.get("episode_lengths", ()))
        kw["shape"] = tuple(kw.get("shape", (0, 0)))
        return cls(store=store, policy_lag=policy_lag, **kw)
