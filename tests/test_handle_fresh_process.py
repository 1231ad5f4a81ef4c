"""A handle unpickled in a fresh process, which has imported nothing of daskrl, loads its batch
from its URL: unpickling it imports the store module, which registers the opener the handle
(whose module does not import the store) opens its store with."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import numpy as np
import pytest

import daskrl
from daskrl.store import TrajectoryStore

CHILD = """
import json, pickle, sys
assert not [m for m in sys.modules if m.startswith("daskrl")]
handle = pickle.loads(open(sys.argv[1], "rb").read())
print(json.dumps(handle.load(keys=["reward"])["reward"].numpy().tolist()))
"""


def _handle(tmp_path):
    w = TrajectoryStore(tmp_path / "s", read_only=False)
    w.initialize()
    reward = np.arange(8, dtype=np.float32).reshape(4, 2)
    meta = {"frames": 8, "weights_version": 0, "worker": "w", "device": "cpu",
            "episode_returns": [], "episode_lengths": [], "shape": [4, 2]}
    w.write_batch(0, {"reward": reward}, meta)
    return daskrl.open_store(w.url).handle(0), reward


def _load_in_a_fresh_process(tmp_path, data: bytes) -> list[list[float]]:
    path = tmp_path / "handle.pickle"
    path.write_bytes(data)
    out = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_a_handle_unpickled_in_a_fresh_process_loads_from_its_url(tmp_path, protocol):
    handle, reward = _handle(tmp_path)
    assert _load_in_a_fresh_process(tmp_path, pickle.dumps(handle, protocol)) == reward.tolist()


def test_a_handle_pickled_under_its_former_module_loads_in_a_fresh_process(tmp_path):
    handle, reward = _handle(tmp_path)
    data = pickle.dumps(handle, 2)  # protocol 2 names the class as text, with no frames
    assert data.count(b"cdaskrl.store\nBatchHandle\n") == 1
    old = data.replace(b"cdaskrl.store\nBatchHandle\n", b"cdaskrl.store._handles\nBatchHandle\n")
    assert _load_in_a_fresh_process(tmp_path, old) == reward.tolist()
