"""The bytes of a batch (store format 2.x), private to :mod:`daskrl.store`: the only way in.

* :func:`encode_batch`: a batch's arrays and attributes -> an :class:`EncodedBatch`, the members
  of one zip container and what a writer needs to write them;
* :func:`read_index`: a container (a :class:`ByteSource`) -> its validated :class:`BatchIndex`
  (directory, array layouts), under :class:`ReadLimits`;
* :func:`read_batch`: the arrays of an indexed container as numpy arrays.

Modules: ``encode`` (writing), ``zip_container`` (the archive format; ``zip_write`` lays one
out, ``zip_read`` parses its directory), ``allowlist`` (what an
array's ``zarr.json`` may say), ``chunks`` (decoding one chunk), ``index`` (directory and
metadata checks, the one decode cache), ``read`` (reading a batch: its planner in
``read_plan``, its local executors in ``read_local`` and ``read_compiled``), ``_source`` (byte
sources), ``_limits`` (limits and thresholds), ``local_io`` (safe local file I/O, also used by
the store for its documents).  ``docs/store-format.md`` describes the format.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskrl._lazy import lazy_names

if TYPE_CHECKING:
    from daskrl.store._format._limits import ReadLimits
    from daskrl.store._format._source import ByteSource, BytesSource, FileSource, ShortReadError
    from daskrl.store._format.allowlist import ArrayLayout
    from daskrl.store._format.encode import EncodedBatch, encode_batch
    from daskrl.store._format.index import BatchIndex, read_index
    from daskrl.store._format.read import ChunkRead, read_batch
    from daskrl.store._format.zip_container import ZipFormatError

__all__ = ["ArrayLayout", "BatchIndex", "ByteSource", "BytesSource", "ChunkRead", "EncodedBatch",
           "FileSource", "ReadLimits", "ShortReadError", "ZipFormatError", "encode_batch",
           "read_batch", "read_index"]

# Imported on first use (PEP 562), so that a light submodule (``compression``, which
# ``daskrl.config`` re-exports) does not bring numcodecs and the reader with it.
_LAZY = {"ReadLimits": "_limits", "ByteSource": "_source", "BytesSource": "_source",
         "FileSource": "_source", "ShortReadError": "_source", "ArrayLayout": "allowlist",
         "EncodedBatch": "encode", "encode_batch": "encode", "BatchIndex": "index",
         "read_index": "index", "ChunkRead": "read", "read_batch": "read",
         "ZipFormatError": "zip_container"}

__getattr__, __dir__ = lazy_names(__name__, _LAZY)
