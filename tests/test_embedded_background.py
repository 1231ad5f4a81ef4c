"""The embedded cluster's background work: the nannies' memory monitors and every server's
system monitor run at daskrl's slower intervals (they took CPU from the rollouts), and the
nanny still stops a worker that goes over its memory limit."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from distributed import Client

from daskrl.deploy import local_cluster

pytestmark = pytest.mark.timeout(180)


def _intervals(server) -> dict[str, float]:
    return {name: pc.callback_time for name, pc in server.periodic_callbacks.items()}


def test_monitors_run_at_the_embedded_intervals():
    with local_cluster(2) as cluster, Client(cluster, set_as_default=False) as client:
        nannies = [_intervals(n) for n in cluster.workers.values()]
        assert [(n["memory_monitor"], n["monitor"]) for n in nannies] == [(500, 2000)] * 2
        workers = client.run(lambda dask_worker: _intervals(dask_worker))
        assert [(w["memory_monitor"], w["monitor"]) for w in workers.values()] == [(500, 2000)] * 2
        assert _intervals(cluster.scheduler)["monitor"] == 2000


def _hog(nbytes: int) -> None:
    block = np.ones(nbytes, np.uint8)  # every page touched
    time.sleep(60)
    del block


def test_the_nanny_still_stops_a_worker_over_its_memory_limit():
    with (local_cluster(1, memory_limit="1GB") as cluster,
          Client(cluster, set_as_default=False) as client):
        (nanny,) = cluster.workers.values()
        pid = nanny.process.process.pid
        assert client.submit(os.getpid, pure=False).result() == pid
        client.submit(_hog, 1_500_000_000, pure=False)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the nanny kills it (and starts a new one)
            proc = nanny.process
            if proc is None or proc.process is None or proc.process.pid != pid:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the worker over its memory limit was not stopped within 60 s")
