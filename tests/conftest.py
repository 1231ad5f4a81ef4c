from __future__ import annotations

import glob
import logging
import os

import gymnasium as gym
import pytest
from distributed import Client, LocalCluster
from distributed.utils_test import gen_cluster  # noqa: F401  (re-exported for the tests; not public API)

from daskrl.policies import MLPPolicy
from daskrl.weights._segments import shared_memory_dir


def pytest_collection_modifyitems(config, items):
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def cluster():
    """Two spawn-started worker processes, one thread each, shared by the session's tests."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None, silence_logs=logging.ERROR) as cluster:
        yield cluster


@pytest.fixture
def client(cluster):
    with Client(cluster, set_as_default=False) as client:
        yield client
        # Each test leaves the shared cluster as it found it, and no weights in shared memory.
        assert not client.list_datasets(), client.list_datasets()
        assert not glob.glob(os.path.join(shared_memory_dir(), f"daskrl-weights-{os.getpid()}-*"))


@pytest.fixture
def inproc_client():
    """An in-process cluster (processes=False): workers share this process's memory."""
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                     dashboard_address=None, silence_logs=logging.ERROR) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        yield client


@pytest.fixture
def cartpole_policy():
    env = gym.make("CartPole-v1")
    return MLPPolicy(env.observation_space, env.action_space)


@pytest.fixture
def tmpfs(tmp_path):
    """A real, tiny (256 KiB) filesystem (root can mount tmpfs; CI runs as root)."""
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture(scope="session")
def slurm_session():
    """The real one-node SLURM of tests/slurm_bed.py, started once (about 2 s) for the
    session's `slurm` tests, stopped at its end with every job and daemon gone."""
    if os.geteuid() != 0:
        pytest.skip("the SLURM test bed runs slurmctld, slurmd and munged as root")
    from slurm_bed import slurm_bed

    with slurm_bed() as bed:
        yield bed


@pytest.fixture
def slurm(slurm_session, monkeypatch):
    """The SLURM bed for one test: SLURM_CONF points this process (and what it starts) at it,
    and the test's jobs are cancelled when it ends, pass or fail."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_session.conf))
    try:
        yield slurm_session
    finally:
        slurm_session.cancel_all()


@pytest.fixture
def s3_with_auth():
    """A moto S3 server on loopback that checks credentials (its IAM knows no keys, so every
    key is refused), with one bucket; ``endpoint``."""
    import urllib.request

    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"

    def auth_after(count: str) -> None:  # moto's switch: authenticate after `count` requests
        req = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=count.encode(),
                                     method="POST", headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(req, timeout=30).read()

    try:
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="setup",
                     aws_secret_access_key="setup", region_name="us-east-1"
                     ).create_bucket(Bucket="daskrl-auth")
        auth_after("0")
        yield endpoint
    finally:
        auth_after("inf")  # moto's settings are per process: restore them for other tests
        server.stop()
