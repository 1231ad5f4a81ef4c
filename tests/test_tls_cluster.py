"""A TLS-only cluster started from the command line: certificates from a test CA,
``require-encryption`` on every process; only clients holding a certificate get in."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from cli_cluster import cli_cluster, make_tls_files, scheduler_address

import daskrl
from daskrl import deploy
from daskrl.testing import ConstantPolicy

REQUIRE_ENCRYPTION = {"DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True"}


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    """(scheduler file, {ca, cert, key} PEM paths): scheduler and two workers on tls://."""
    tmp = tmp_path_factory.mktemp("tls-cluster")
    tls = make_tls_files(tmp / "tls")
    with cli_cluster(tmp, n_workers=2, tls=tls, env=REQUIRE_ENCRYPTION) as (sched, procs):
        security = deploy.tls_security(str(tls["ca"]), str(tls["cert"]), str(tls["key"]))
        with deploy.connect(scheduler_address(sched), security=security) as d:
            try:
                d.client.wait_for_workers(2, timeout=120)
            except TimeoutError:
                pytest.fail(f"the TLS workers did not start:\n{procs.logs()}")
        yield sched, tls


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "daskrl.cli", *args], capture_output=True,
                          text=True, timeout=240)


def test_tls_cluster_collects_for_a_client_with_certificates(tls_cluster, tmp_path):
    sched, tls = tls_cluster
    address = scheduler_address(sched)
    assert address.startswith("tls://127.0.0.1:")
    security = deploy.tls_security(str(tls["ca"]), str(tls["cert"]), str(tls["key"]))
    store = str(tmp_path / "store")
    with (
        deploy.connect(address, security=security) as d,
        daskrl.Collector("CartPole-v1", ConstantPolicy(0), store,
                         client=d.client, envs_per_worker=2, frames_per_batch=32,
                         total_frames=128) as collector,
    ):
        handles = list(collector)
    assert len({h.worker for h in handles}) == 2
    assert all(h.worker.startswith("tls://127.0.0.1:") for h in handles)
    assert daskrl.open_store(store).frames == 128

    # The CLI with the same certificates sees both workers.
    out = _cli("info", "--scheduler", address, "--tls-ca-file", str(tls["ca"]),
               "--tls-cert", str(tls["cert"]), "--tls-key", str(tls["key"]))
    assert out.returncode == 0, out.stderr
    assert f"scheduler: {address}  (2 workers)" in out.stdout
    assert len(re.findall(r"^tls://127\.0\.0\.1:\d+\s+cli-worker-\d", out.stdout, re.M)) == 2


def test_tls_cluster_refuses_clients_without_certificates(tls_cluster, tmp_path):
    sched, _ = tls_cluster
    address = scheduler_address(sched)
    # No certificates for a tls:// address: refused here, before any connection.
    with pytest.raises(daskrl.ConfigError, match=re.escape(
            f"the scheduler uses TLS ({address}) but no certificates were given: pass "
            "security=daskrl.deploy.tls_security(ca_file, cert, key)")):
        deploy.connect(address)
    # A plain tcp:// client (another process) is dropped by the scheduler.
    plain = "tcp://" + address.removeprefix("tls://")
    out = _cli("info", "--scheduler", plain)
    assert out.returncode == 1  # a runtime error (ClusterError): no cluster to talk to
    assert f"daskrl: error: could not connect to the scheduler at {plain}: " in out.stderr
    assert "If the cluster uses TLS, pass security=tls_security" in out.stderr
    # A client with a certificate from another CA fails the TLS handshake.
    other = make_tls_files(tmp_path / "other-ca", common_name="intruder")
    out = _cli("info", "--scheduler", address, "--tls-ca-file", str(other["ca"]),
               "--tls-cert", str(other["cert"]), "--tls-key", str(other["key"]))
    assert out.returncode == 1
    assert f"daskrl: error: could not connect to the scheduler at {address}: " in out.stderr
    assert "TLS certificate does not match" in out.stderr  # distributed's own words
