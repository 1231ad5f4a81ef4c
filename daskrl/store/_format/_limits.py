"""How far a reader trusts a batch (:class:`ReadLimits`), and the reader's I/O thresholds.

A store may come from anywhere: the limits bound what a small file can make the reader
allocate, loop over or read.  Every refusal names the limit and how to raise it, since a
trusted store with unusually large batches may need more.  The thresholds below are the one
definition of each; they tune speed, not safety.
"""

from __future__ import annotations

import dataclasses

from daskrl.errors import ConfigError

__all__ = ["CRC_BLOCK", "DEFAULT_LIMITS", "IOV_RUN", "LOCAL_TAIL_BYTES", "PARALLEL_BYTES", "REMOTE_TAIL_BYTES",
           "ReadLimits"]

LOCAL_TAIL_BYTES = 32 << 10
"""Bytes read from the end of a local container to find its directory and documents."""
REMOTE_TAIL_BYTES = 1 << 20
"""Bytes asked for from the end of a remote container (smaller containers arrive whole)."""
PARALLEL_BYTES = 1 << 20
"""Batches that decode to fewer bytes are read on the calling thread (a pool costs more)."""
CRC_BLOCK = 256 << 10
"""Bytes of a large uncompressed chunk read per call before checksumming them (while they are
still in the CPU cache)."""
IOV_RUN = 960
"""Most buffers in one ``preadv`` over adjacent small members (the kernel's IOV_MAX is 1024)."""

_HOW = ("if this store is trusted, raise it: open_store(url, read_limits=ReadLimits({}=...)) "
        "(from daskrl.store import ReadLimits)")


@dataclasses.dataclass(frozen=True, slots=True)
class ReadLimits:
    """Bounds a reader applies to every batch before it reads the batch's data.

    Pass to :func:`~daskrl.open_store` (``read_limits=``) or ``TrajectoryStore(...,
    read_limits=...)`` to read a trusted store whose batches exceed the defaults.
    """

    max_document_bytes: int = 1 << 20
    """Largest ``zarr.json`` member accepted (daskrl writes under 1 KiB)."""
    max_expansion: int = 1024
    """A batch's arrays may decode to at most ``max(free_bytes, max_expansion * file size)``."""
    free_bytes: int = 1 << 30
    """Decoded bytes any batch may have, whatever its file's size."""
    max_missing_chunks: int = 1 << 16
    """A batch's arrays may have at most ``max(max_missing_chunks, 2 * chunk members)``
    chunks (absent chunks read as fill: a grid of mostly absent chunks is a loop bomb)."""
    max_directory_bytes: int = 64 << 20
    """Largest zip central directory accepted (about a million members)."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"ReadLimits.{field.name} must be a positive integer, got "
                                  f"{value!r}.")

    @staticmethod
    def how_to_raise(field: str) -> str:
        """The advice an error message gives for the limit ``field``."""
        return _HOW.format(field)


DEFAULT_LIMITS = ReadLimits()
"""The limits a reader applies unless given others."""
