"""A sampler of shuffled minibatches that reads each batch of a large store once per epoch.

Shuffling a :class:`~daskrl.TransitionDataset` whose decoded batches do not fit in its cache
reads a batch for almost every item of a minibatch.  :class:`GroupShuffleSampler` shuffles
the order of the batches, takes them ``resident_batches`` at a time, shuffles the items of
each group together and cuts the stream into minibatches: a minibatch mixes the items of
``resident_batches`` batches (of two groups where it straddles them), and with a cache of at
least ``2 * resident_batches`` batches each batch is read once per epoch and loader process.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import Sampler

from daskrl.errors import ConfigError

__all__ = ["GroupShuffleSampler"]


class GroupShuffleSampler(Sampler[list[int]]):
    """Minibatches of indices of ``dataset`` (a :class:`~daskrl.TransitionDataset`), shuffled
    within groups of ``resident_batches`` batches; use it as ``DataLoader(dataset,
    sampler=GroupShuffleSampler(dataset, 256), batch_size=None)``.

    ``seed``: None draws from torch's default generator (so ``torch.manual_seed`` makes epochs
    reproducible); an int fixes the sequence of epochs.  ``drop_last``: drop a last minibatch
    smaller than ``batch_size``.
    """

    def __init__(self, dataset: object, batch_size: int, *, resident_batches: int = 8,
                 drop_last: bool = False, seed: int | None = None) -> None:
        for name, v in (("batch_size", batch_size), ("resident_batches", resident_batches)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {v!r}.")
        starts = getattr(dataset, "_starts", None)
        if starts is None:
            raise ConfigError("GroupShuffleSampler samples a daskrl.TransitionDataset, got "
                              f"{type(dataset).__name__}.")
        self.starts = np.asarray(starts, np.int64)
        self.batch_size = batch_size
        self.resident_batches = resident_batches
        self.drop_last = drop_last
        self.seed = seed
        self._epoch = 0

    def __len__(self) -> int:
        n = int(self.starts[-1])
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _rng(self) -> np.random.Generator:
        if self.seed is None:
            return np.random.default_rng(int(torch.randint(0, 2**62, ()).item()))
        self._epoch += 1
        return np.random.default_rng([self.seed, self._epoch])

    def __iter__(self) -> Iterator[list[int]]:
        rng = self._rng()
        counts = np.diff(self.starts)
        order = rng.permutation(np.flatnonzero(counts))
        carry = np.empty(0, np.int64)
        for g in range(0, len(order), self.resident_batches):
            group = order[g:g + self.resident_batches]
            items = np.concatenate([np.arange(self.starts[b], self.starts[b + 1]) for b in group])
            stream = np.concatenate([carry, rng.permutation(items)])
            cut = len(stream) - len(stream) % self.batch_size
            for s in range(0, cut, self.batch_size):
                yield stream[s:s + self.batch_size].tolist()
            carry = stream[cut:]
        if len(carry) and not self.drop_last:
            yield carry.tolist()
