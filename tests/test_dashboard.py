"""The embedded cluster's dashboard: opt-in (``dashboard=True`` or a port, ``daskrl collect
--dashboard [PORT]``), served on 127.0.0.1 only at the link daskrl prints; off, nothing listens
and no link is advertised. Checked with real HTTP requests, the kernel's socket tables (psutil)
and connection attempts on this machine's other addresses."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from urllib.parse import urlsplit

import psutil
import pytest
from cli_inprocess import daskrl_main
from distributed import Client

import daskrl
from daskrl.deploy import local_cluster
from daskrl.deploy._cluster import DASHBOARD_PORT, _dashboard_address, dashboard_link
from daskrl.testing import ConstantPolicy

pytestmark = pytest.mark.timeout(300)


def _listening(pid: int) -> set[tuple[str, int]]:
    return {(c.laddr.ip, c.laddr.port)
            for c in psutil.Process(pid).net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN}


def _get(url: str) -> tuple[int, bytes]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("GET", parts.path or "/")
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _other_addresses() -> list[tuple[int, str]]:
    """``(family, address)`` of this machine's non-loopback interfaces."""
    out = []
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6) and not a.address.startswith(
                    ("127.", "::1", "fe80")):
                out.append((a.family, a.address))
    return out


def _refused_elsewhere(port: int) -> None:
    """Nothing accepts a connection to ``port`` on any non-loopback address of this machine
    (nor on ``::1``)."""
    for family, address in [*_other_addresses(), (socket.AF_INET6, "::1")]:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            assert s.connect_ex((address, port)) != 0, (address, port)


def _assert_serves_status(link: str) -> int:
    parts = urlsplit(link)
    assert parts.scheme == "http" and parts.hostname == "127.0.0.1" and parts.path == "/status"
    status, body = _get(link)
    assert status == 200, (status, body[:200])
    assert b"bokeh" in body.lower()  # the dashboard itself, not the 404 page of a bare server
    assert parts.port is not None
    return parts.port


def test_the_dashboard_setting():
    assert _dashboard_address(None) is None and _dashboard_address(False) is None
    assert _dashboard_address(True) == f"127.0.0.1:{DASHBOARD_PORT}"
    assert _dashboard_address(0) == "127.0.0.1:0"  # any free port, not "off"
    assert _dashboard_address(9000) == "127.0.0.1:9000"
    for bad in (-1, 65536, "8787", 1.5, [8787]):
        with pytest.raises(daskrl.ConfigError, match="dashboard must be True, False or a port"):
            _dashboard_address(bad)
    with pytest.raises(daskrl.ConfigError, match="not both"):
        local_cluster(1, dashboard=True, dashboard_address="127.0.0.1:0")


@pytest.mark.parametrize("tls", [True, False])
def test_on_it_serves_status_at_its_link_on_loopback_only(tls):
    before = _listening(os.getpid())
    with local_cluster(1, tls=tls, dashboard=0) as cluster:
        link = dashboard_link(cluster)
        assert link is not None
        port = _assert_serves_status(link)
        found = _listening(os.getpid()) - before
        assert ("127.0.0.1", port) in found
        assert all(ip == "127.0.0.1" for ip, _ in found), found  # no 0.0.0.0, no ::
        _refused_elsewhere(port)
        with Client(cluster, set_as_default=False) as client:
            assert client.scheduler_info()["services"]["dashboard"] == port
            assert client.submit(sum, [1, 2]).result() == 3
    with socket.socket() as s:  # closed with the cluster
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_a_collector_serves_it_while_collecting(tmp_path):
    with daskrl.Collector("CartPole-v1", ConstantPolicy(0), str(tmp_path / "s"), num_workers=1,
                          envs_per_worker=2, frames_per_batch=32, total_frames=128,
                          dashboard=0) as collector:
        link = collector.dashboard_link
        assert link is not None
        for _ in collector:
            port = _assert_serves_status(link)
        status, _ = _get(link.replace("/status", "/info/main/workers.html"))
        assert status == 200
        _refused_elsewhere(port)
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
    assert daskrl.open_store(str(tmp_path / "s")).frames == 128


def test_off_nothing_listens_and_no_link_is_advertised(tmp_path):
    before = _listening(os.getpid())
    with daskrl.Collector("CartPole-v1", ConstantPolicy(0), str(tmp_path / "s"), num_workers=1,
                          envs_per_worker=2, frames_per_batch=32, total_frames=64) as collector:
        assert collector.dashboard_link is None
        assert not collector.client.dashboard_link  # distributed's own: "" (no service)
        info = collector.client.scheduler_info()
        assert "dashboard" not in info["services"]
        for _ in collector:
            found = _listening(os.getpid()) - before
            comm = {int(info["address"].rsplit(":", 1)[1])} | {
                int(w["nanny"].rsplit(":", 1)[1]) for w in info["workers"].values()}
            comm.add(int(collector.learner_address.rsplit(":", 1)[1]))  # the streams' listener
            assert {port for _, port in found} == comm  # the comm ports only: no HTTP server
    with pytest.raises(daskrl.UsageError, match="dashboard= configures the embedded cluster"):
        daskrl.Collector("CartPole-v1", ConstantPolicy(0), str(tmp_path / "t"),
                         client=collector.client, dashboard=True)


def test_cli_prints_the_link_to_stderr_and_serves_it(tmp_path):
    # The real command (a process of its own): the link reaches a pipe while the command runs,
    # and SIGTERM ends it with its status, the cluster closed.
    proc = subprocess.Popen(
        [sys.executable, "-m", "daskrl.cli", "collect", "--env", "CartPole-v1", "--store",
         str(tmp_path / "s"), "--workers", "1", "--envs-per-worker", "2",
         "--frames-per-batch", "64", "--frames", "10000000", "--dashboard", "0", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        line = ""
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if line.startswith("dashboard: ") or not line:
                break
        assert line.startswith("dashboard: "), line
        port = _assert_serves_status(line.split(" ", 1)[1].strip())
        _refused_elsewhere(port)
    finally:
        proc.send_signal(signal.SIGTERM)  # unwinds like Ctrl-C: the cluster is closed
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert out == ""  # stdout stays for the JSON summary
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_cli_refuses_a_dashboard_it_cannot_serve(tmp_path):
    cmd = ["collect", "--env", "CartPole-v1", "--store", str(tmp_path / "s"), "--frames", "64"]
    bad_port = daskrl_main(*cmd, "--dashboard", "70000")
    assert bad_port.returncode == 2
    assert "--dashboard takes a port 0-65535" in bad_port.stderr
    running = daskrl_main(*cmd, "--dashboard", "--scheduler", "tcp://127.0.0.1:9")
    assert running.returncode == 3  # a configuration error
    assert "--dashboard applies to the embedded cluster only" in running.stderr
    assert not (tmp_path / "s").exists()


def test_without_bokeh_asking_for_it_names_the_extra(tmp_path):
    """bokeh made unimportable in a fresh interpreter (``sys.modules["bokeh"] = None``): the
    API, then the command (its entry point, whose status the interpreter exits with)."""
    script = textwrap.dedent(f"""
        import sys
        sys.modules["bokeh"] = None
        import daskrl
        from daskrl.cli import main
        from daskrl.deploy import local_cluster
        from daskrl.testing import ConstantPolicy
        for make in (lambda: local_cluster(1, dashboard=True),
                     lambda: daskrl.Collector("CartPole-v1", ConstantPolicy(0),
                                              {str(tmp_path / "s")!r}, dashboard=0)):
            try:
                make()
            except daskrl.MissingDependencyError as e:
                print(e)
            else:
                raise SystemExit("no error")
        with local_cluster(1) as cluster:  # without a dashboard bokeh is not needed
            print("link", repr(cluster.dashboard_link))
        sys.exit(main(["collect", "--env", "CartPole-v1", "--store", {str(tmp_path / "c")!r},
                       "--frames", "64", "--dashboard"]))
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 3, r.stderr  # the command's: a missing extra is configuration
    lines = r.stdout.splitlines()
    assert len(lines) == 3, r.stdout
    for line in lines[:2]:
        assert 'needs bokeh' in line and 'pip install "daskrl[dashboard]"' in line
    assert lines[2] == "link ''"
    [error] = [line for line in r.stderr.splitlines() if line.startswith("daskrl: error: ")]
    assert 'pip install "daskrl[dashboard]"' in error, r.stderr
    assert not (tmp_path / "c").exists()
