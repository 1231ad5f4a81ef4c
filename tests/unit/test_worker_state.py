"""A worker's error reaches the learner as itself through Dask's error transport (its pickling,
no cluster). (A collector's state on real in-process Dask workers: tests/test_worker_state.py.)"""

from __future__ import annotations

import inspect

from distributed.core import error_message
from distributed.protocol import pickle as dask_pickle

import daskrl.errors as errors


def test_every_daskrl_error_survives_dasks_error_transport():
    """A worker's error reaches the learner as itself (Dask pickles it with tblib)."""
    for name, cls in inspect.getmembers(errors, inspect.isclass):
        if not issubclass(cls, errors.DaskrlError):
            continue
        try:
            raise cls("what was wrong\nand what to do")
        except cls as e:
            msg = error_message(e)
        exc = dask_pickle.loads(msg["exception"].data)  # what the learner unpickles
        assert type(exc) is cls, name
        assert "what to do" in str(exc), name
