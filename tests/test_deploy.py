"""daskrl.deploy.connect: the embedded cluster, and the errors of a bad target (no cluster
needed for those: they fail before any connection)."""

from __future__ import annotations

import json
import re
import socket

import pytest

import daskrl
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


def test_bad_targets_are_clear_errors(tmp_path):
    with pytest.raises(daskrl.ConfigError, match=re.escape(
            "workers=, security=True and cluster options size or configure a cluster daskrl "
            "starts ('local' or 'slurm'); a running cluster is sized by whoever started it. "
            "Got workers=4, options=[].")):
        deploy.connect("tcp://127.0.0.1:8786", workers=4)
    with pytest.raises(daskrl.ConfigError, match=re.escape(
            "workers must be a non-negative integer or None, got -1.")):
        deploy.connect("local", workers=-1)
    missing = tmp_path / "scheduler.json"
    with pytest.raises(daskrl.ConfigError, match=re.escape(
            f"scheduler file {str(missing)!r} does not exist. Start the scheduler with "
            "`dask scheduler --scheduler-file PATH`")):
        deploy.connect(scheduler_file=missing)
    missing.write_text(json.dumps({"type": "Scheduler"}))
    with pytest.raises(daskrl.ConfigError, match=re.escape(
            f"scheduler file {str(missing)!r} holds no scheduler address")):
        deploy.connect(scheduler_file=missing)
    with pytest.raises(daskrl.ConfigError, match=re.escape(
            "'nonsense://x' is not a Dask scheduler address")):
        deploy.connect("nonsense://x")
    with pytest.raises(daskrl.ConfigError, match=re.escape(
            "TLS CA file '/nonexistent/ca.pem' does not exist or is not a file.")):
        deploy.tls_security("/nonexistent/ca.pem", "/nonexistent/cert.pem")


def test_nothing_listening_fails_fast_with_the_address():
    with socket.socket() as s:  # a free port, closed again: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    with pytest.raises(ClusterError, match=re.escape(
            f"nothing accepts connections at {address} (the scheduler): ")):
        deploy.connect(address, timeout=5)
