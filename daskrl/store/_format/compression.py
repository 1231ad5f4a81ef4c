"""The compressors a batch's chunks may be stored with (``daskrl.config`` re-exports it)."""

from __future__ import annotations

import enum

__all__ = ["Compression"]


class Compression(str, enum.Enum):
    """Compressor of the stored chunks (a checksum is always added); the writer stores raw
    each array it would shrink by less than 10 % (see the store format's codecs)."""

    ZSTD = "zstd"
    LZ4 = "lz4"
    NONE = "none"
