"""The nanny preload refuses to run anywhere but in a nanny. (The semaphore files of real
clusters, learners and workers killed whole: tests/test_shm_files.py.)"""

from __future__ import annotations

import pytest

from daskrl.deploy import nanny_preload


def test_the_nanny_preload_refuses_to_run_in_a_worker():
    with pytest.raises(TypeError, match="pass it with --preload-nanny, not --preload"):
        nanny_preload.dask_setup(object())
