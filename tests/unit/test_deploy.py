"""daskrl.deploy.connect: the errors of a bad target, raised before any connection or cluster.
(The embedded cluster, and a target where nothing listens: tests/test_deploy.py.)"""

from __future__ import annotations

import json
import re

import pytest

import daskrl
from daskrl import deploy


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
