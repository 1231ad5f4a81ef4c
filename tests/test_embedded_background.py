"""The embedded cluster's background work: the nannies' memory monitors and every server's
system monitor run at daskrl's slower intervals (they took CPU from the rollouts), the nanny
still stops a worker that goes over its memory limit, and the learner fetches handles from the
workers without the scheduler relaying them."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from distributed import Client

import daskrl
from daskrl.deploy import local_cluster
from daskrl.testing import TagPolicy

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


def test_the_embedded_learner_fetches_handles_from_the_workers_not_through_the_scheduler(
        tmp_path):
    """Dask relays a fetch through the scheduler for a client outside the cluster (two more
    hops on the learner's event loop, where the embedded scheduler runs); the embedded
    cluster's learner is on the workers' machine and asks them itself."""
    with daskrl.Collector("daskrl.testing:Counting-v0", TagPolicy(), str(tmp_path / "s"),
                          num_workers=2, envs_per_worker=2, frames_per_batch=20,
                          total_frames=200) as c:
        scheduler = c.client.cluster.scheduler
        relayed = []
        gather = scheduler.handlers["gather"]

        async def counted(*args, **kwargs):
            relayed.append(kwargs.get("keys"))
            return await gather(*args, **kwargs)

        scheduler.handlers["gather"] = counted
        handles = list(c)
    assert len(handles) == 10 and sum(h.frames for h in handles) == 200
    assert relayed == []
