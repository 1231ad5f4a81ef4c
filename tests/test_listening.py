"""What the embedded cluster listens on: every listening TCP socket of its processes, found in
the kernel's socket tables (psutil reads /proc/net/tcp and /proc/<pid>/fd), and probed with
real HTTP requests. Only the comm ports may listen; no HTTP server without a dashboard."""

from __future__ import annotations

import http.client
import os
import ssl

import psutil
import pytest
from distributed import Client

import daskrl
from daskrl.deploy import local_cluster
from daskrl.testing import ConstantPolicy

pytestmark = pytest.mark.timeout(300)


def _listening(pid: int) -> set[tuple[str, int]]:
    """``(ip, port)`` of every TCP socket that process ``pid`` holds in the LISTEN state."""
    return {(c.laddr.ip, c.laddr.port)
            for c in psutil.Process(pid).net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN}


def _http_status(host: str, port: int, tls: bool = False) -> int | None:
    """The status of a plain (or, ``tls``, certificate-less HTTPS) ``GET /health``; None if
    the port does not answer HTTP."""
    if tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(host, port, timeout=10,
                                                                         context=ctx)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status
    except (OSError, http.client.HTTPException):  # reset, closed, TLS refused, not HTTP
        return None
    finally:
        conn.close()


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def _cluster_sockets(client: Client, before: set[tuple[str, int]]) -> dict[str, set]:
    """Listening sockets of the learner process (new since ``before``: the scheduler and the
    nannies live here) and of each worker process, with the comm ports the cluster reports."""
    info = client.scheduler_info()
    workers = info["workers"]
    pids = client.run(os.getpid)
    comm = {_port(info["address"])}
    for address, w in workers.items():
        comm |= {_port(address), _port(w["nanny"])}
    found = _listening(os.getpid()) - before
    for pid in pids.values():
        found |= _listening(pid)
    return {"found": found, "comm": comm, "scheme": {info["address"].split("://")[0]}}


@pytest.mark.parametrize("tls", [True, False])
def test_embedded_cluster_listens_on_its_comm_ports_only(tls):
    before = _listening(os.getpid())
    with local_cluster(2, tls=tls) as cluster, Client(cluster, set_as_default=False) as client:
        s = _cluster_sockets(client, before)
        assert s["scheme"] == {"tls" if tls else "tcp"}
        assert {port for _, port in s["found"]} == s["comm"]  # nothing but the comm ports
        assert all(ip == "127.0.0.1" for ip, _ in s["found"])
        for ip, port in s["found"]:  # and none of them answers HTTP, plain or TLS
            assert _http_status(ip, port) is None, port
            assert _http_status(ip, port, tls=True) is None, port
        assert "dashboard" not in client.scheduler_info()["services"]
        assert cluster.dashboard_link == ""
        # The cluster works all the same (its workers run tasks).
        assert client.submit(sum, [1, 2]).result() == 3


def test_collectors_own_cluster_serves_no_http(tmp_path):
    """``Collector(client=None)``: checked while it collects."""
    before = _listening(os.getpid())
    with daskrl.Collector("CartPole-v1", ConstantPolicy(0), str(tmp_path / "s"), num_workers=2,
                          envs_per_worker=2, frames_per_batch=16, total_frames=64) as collector:
        for _ in collector:
            s = _cluster_sockets(collector.client, before)
            # the cluster's comm ports, and the learner's listener for its streams (TLS too)
            assert collector.learner_address.startswith("tls://127.0.0.1:")
            assert {port for _, port in s["found"]} == s["comm"] | {
                _port(collector.learner_address)}
            assert s["scheme"] == {"tls"}
            assert all(_http_status(ip, port) is None for ip, port in s["found"])
    assert daskrl.open_store(str(tmp_path / "s")).frames == 64


def test_a_dashboard_is_served_only_when_asked_for():
    before = _listening(os.getpid())
    with (
        local_cluster(1, dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        s = _cluster_sockets(client, before)
        dashboard = client.scheduler_info()["services"]["dashboard"]
        assert {port for _, port in s["found"]} == s["comm"] | {dashboard}
        assert _http_status("127.0.0.1", dashboard) == 200  # plain HTTP, no authentication
        for ip, port in s["found"] - {("127.0.0.1", dashboard)}:
            assert _http_status(ip, port) is None, port
