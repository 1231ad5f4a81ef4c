"""This process's live ``multiprocessing`` children (an embedded cluster's processes among
them): shared by tests/test_collector.py and tests/unit/test_collector.py."""

from __future__ import annotations

import multiprocessing


def children() -> set[int]:
    return {p.pid for p in multiprocessing.active_children() if p.is_alive()}
