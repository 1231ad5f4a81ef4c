"""Semaphore names dropped early (daskrl/_semaphores.py): the files go, the semaphores work."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from daskrl._semaphores import queue_locks, release_semaphore_names

pytestmark = pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")


def _file(lock) -> Path:
    return Path("/dev/shm") / ("sem." + lock._semlock.name.lstrip("/"))


def test_a_spawn_context_lock_loses_its_file_and_still_works():
    lock = multiprocessing.get_context("spawn").Lock()  # named, as in a spawned worker
    assert _file(lock).exists()
    assert release_semaphore_names(lock, None, object()) == 1  # others are skipped
    assert not _file(lock).exists()
    assert lock.acquire(timeout=1) and not lock.acquire(block=False)
    lock.release()
    assert release_semaphore_names(lock) == 0  # its finalizer went with the name


def test_a_queues_three_semaphores_are_released_and_it_still_carries_items():
    queue = multiprocessing.get_context("spawn").Queue()
    files = [_file(lock) for lock in queue_locks(queue, None)]
    assert len(files) == 3 and all(f.exists() for f in files)
    assert release_semaphore_names(*queue_locks(queue)) == 3
    assert not any(f.exists() for f in files)
    queue.put(os.getpid())
    assert queue.get(timeout=10) == os.getpid()
    queue.close()
    queue.join_thread()

