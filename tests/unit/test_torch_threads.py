"""Torch's threads on a worker follow the worker's thread count, unless the user chose."""

from __future__ import annotations

import pytest
import torch

from daskrl.worker._threads import THREAD_VARS, size_torch_threads


@pytest.fixture
def torch_threads(monkeypatch):
    """Torch at 2 threads with no thread variable set; restored afterwards."""
    before = torch.get_num_threads()
    for var in THREAD_VARS:
        monkeypatch.delenv(var, raising=False)
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_a_worker_of_one_thread_gets_one_torch_thread(torch_threads):
    assert size_torch_threads(1, {}, "w") == 1
    assert torch.get_num_threads() == 1


def test_a_count_in_the_workers_environment_is_left_alone(torch_threads, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert size_torch_threads(1, {}, "w") is None
    assert torch.get_num_threads() == 2


def test_a_count_in_env_vars_is_applied_to_torch(torch_threads):
    assert size_torch_threads(1, {"MKL_NUM_THREADS": "3"}, "w") == 3
    assert torch.get_num_threads() == 3


def test_a_nested_count_in_env_vars_is_left_to_torch(torch_threads):
    assert size_torch_threads(1, {"OMP_NUM_THREADS": "4,2"}, "w") is None
    assert torch.get_num_threads() == 2


def test_a_smaller_count_the_user_set_is_kept(torch_threads):
    torch.set_num_threads(1)
    assert size_torch_threads(2, {}, "w") is None
    assert torch.get_num_threads() == 1
