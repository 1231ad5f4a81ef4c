"""CRC32C, the checksum of weights versions and of the store's chunks.

Computed by the ``crc32c`` package (SSE4.2/ARMv8 instructions) with the GIL released, so that a
thread pool checks several chunks of a batch at once: ``google_crc32c`` holds the GIL, which
made checking a 58 MiB batch of frames a single-core job.  (zarr's own ``crc32c`` codec uses
``google_crc32c``; both compute the same CRC-32C.)
"""

from __future__ import annotations

from typing import Any

import crc32c as _crc32c

__all__ = ["crc32c"]


def crc32c(data: Any, value: int = 0) -> int:
    """CRC-32C of the contiguous buffer ``data``, continuing ``value`` (the CRC of what came
    before it; 0 to start)."""
    return _crc32c.crc32c(data, value, gil_release_mode=1)
