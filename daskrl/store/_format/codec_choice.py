"""Which arrays a writer compresses: those whose compression saves enough.

Compression pays for itself on pixels and on large arrays of flags or ids, but not on
low-dimensional float observations (random walks, actions, log-probs barely shrink), where it
only costs time: a codec encodes and decodes slower than a page cache moves bytes.  The store
format's page ("Raw where compression gains little") has the figures.  A :class:`CodecChoices` remembers, per array of a stream of batches
(one writer's stream, an array's name, dtype and trailing shape), whether the compressor
saved at least :data:`MIN_SAVING` of the array's bytes, and :data:`MIN_SAVED_BYTES` (64 KiB),
the last time it was tried, and the encoder (:mod:`.encode`) stores the array raw (codecs ``bytes`` ->
``crc32c``) when it did not.
The decision is recorded where it always was, in each array's ``zarr.json``: a reader needs
nothing new.

A compressed array is re-judged on every batch for free (its compressed size is known); a raw
one is compressed again only every :data:`RETRY_EVERY`-th batch, so that data that becomes
compressible (an env that settles into a pattern) is compressed again, at a cost of one
compression in ``RETRY_EVERY`` batches.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable

__all__ = ["MIN_SAVED_BYTES", "MIN_SAVING", "RETRY_EVERY", "CodecChoices"]

MIN_SAVING = 0.10
"""An array is compressed when its compressed chunks are at most ``1 - MIN_SAVING`` of its raw
chunks' bytes ..."""

MIN_SAVED_BYTES = 64 << 10
"""... and at least this many bytes smaller: reading a compressed chunk has a fixed cost however
small it is (the codec's set-up, its header and scratch checks, the reader's path for it), about
the time a page cache moves this many bytes, so the ids, steps and flags of a batch of a few
thousand frames are read faster raw than decoded, for at most 64 KiB more on disk per array. Their compressed sizes also vary from batch
to batch, where raw sizes do not: a batch of raw arrays has the layout of the first batch of its
shape, which the reader's compiled plans recognise. Larger batches' ids are compressed."""

RETRY_EVERY = 64
"""A raw array's compression is tried again on every ``RETRY_EVERY``-th batch."""

_MAX_KEYS = 4096
"""Decisions kept at most (streams x arrays); cleared when full (each is re-made in a batch)."""


class CodecChoices:
    """Per-array compress-or-raw decisions of one writer (thread-safe).

    ``should_try(key)`` says whether to compress the array of ``key`` in this batch (to use or
    to judge); ``judge(key, raw, stored)`` records what it gave and says whether to keep it.
    """

    def __init__(self, min_saving: float = MIN_SAVING, retry_every: int = RETRY_EVERY,
                 min_saved_bytes: int = MIN_SAVED_BYTES) -> None:
        if not 0.0 <= min_saving < 1.0 or retry_every < 1 or min_saved_bytes < 0:
            raise ValueError("min_saving must lie in [0, 1), retry_every be at least 1 and "
                             "min_saved_bytes at least 0")
        self.min_saving = min_saving
        self.min_saved_bytes = min_saved_bytes
        self.retry_every = retry_every
        self._raw_batches: dict[Hashable, int] = {}
        """Key -> raw batches written since the last try; absent: compress (or not yet known)."""
        self._known: set[Hashable] = set()
        self._lock = threading.Lock()

    def should_try(self, key: Hashable) -> bool:
        """Compress this array in this batch: it is compressed, undecided, or due a retry."""
        with self._lock:
            if key not in self._known:
                return True
            n = self._raw_batches.get(key)
            if n is None:
                return True
            if n + 1 >= self.retry_every:
                return True
            self._raw_batches[key] = n + 1
            return False

    def judge(self, key: Hashable, raw_bytes: int, stored_bytes: int) -> bool:
        """Record an array's compressed size; True to keep it compressed, False to store it raw
        (now and in the next batches)."""
        keep = (stored_bytes <= (1.0 - self.min_saving) * raw_bytes
                and raw_bytes - stored_bytes >= self.min_saved_bytes)
        with self._lock:
            if len(self._known) >= _MAX_KEYS and key not in self._known:
                self._known.clear()
                self._raw_batches.clear()
            self._known.add(key)
            if keep:
                self._raw_batches.pop(key, None)
            else:
                self._raw_batches[key] = 0
        return keep

    def decisions(self) -> dict[Hashable, bool]:
        """Key -> compressed (True) or raw (False), for what was decided so far."""
        with self._lock:
            return {k: k not in self._raw_batches for k in self._known}
