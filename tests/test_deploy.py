"""daskrl.deploy.connect: the embedded cluster, and a target where nothing listens. (The
errors of a bad target, raised before any connection: tests/unit/test_deploy.py.)"""

from __future__ import annotations

import re
import socket

import pytest

from daskrl import deploy
from daskrl.errors import ClusterError


def test_local_deployment_starts_and_closes_its_cluster():
    with deploy.connect("local", workers=1, security=True) as d:
        assert d.cluster is not None
        assert d.client.scheduler.address.startswith("tls://")  # temporary certificates
        [report] = deploy.worker_report(d.client).values()
        assert (report["device"], report["threads"], report["DASKRL_DEVICE"]) == ("cpu", "1", "")
    assert d.cluster.status.name == "closed"
    assert d.client.status == "closed"


def test_nothing_listening_fails_fast_with_the_address():
    with socket.socket() as s:  # a free port, closed again: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    with pytest.raises(ClusterError, match=re.escape(
            f"nothing accepts connections at {address} (the scheduler): ")):
        deploy.connect(address, timeout=5)
