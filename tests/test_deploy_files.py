"""The container and Kubernetes recipes (deploy/docker, deploy/kubernetes) cannot run here (no
docker, no Kubernetes): check what can be checked, the entry point by running it, the
manifests by reading them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "deploy" / "docker"
K8S = ROOT / "deploy" / "kubernetes"


def test_dockerfile_copies_files_that_exist_and_installs_extras_that_exist():
    text = (DOCKER / "Dockerfile").read_text()
    sources = [line.split()[1:-1] for line in text.splitlines() if line.startswith("COPY ")]
    assert sources
    for src in (s for group in sources for s in group):
        assert (ROOT / src).exists(), src
    pyproject = (ROOT / "pyproject.toml").read_text()  # (no tomllib on Python 3.10)
    extras = pyproject.split("[project.optional-dependencies]")[1].split("\n[")[0]
    installed = re.findall(r'pip install "\.\[(\w+)\]"', text)
    assert installed
    for extra in installed:
        assert re.search(rf"^{extra} = \[", extras, re.M), extra
    assert 'pip install "torch==${TORCH_VERSION}"' in text  # torch first, from a chosen index


def test_entrypoint_maps_roles_to_dask_commands():
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}

    def run(*args: str) -> str:
        out = subprocess.run(["bash", str(DOCKER / "entrypoint.sh"), *args], env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert "Usage: dask scheduler " in run("scheduler", "--help")
    assert "Usage: dask scheduler " in run("dask-scheduler", "--help")  # operator's default
    assert "Usage: dask worker " in run("worker", "--help")
    assert "Usage: dask worker " in run("dask-worker", "--help")
    assert run("python", "-c", "print('passed through')") == "passed through\n"


def test_kubernetes_manifests_fit_together():
    [cluster] = yaml.safe_load_all((K8S / "daskcluster.yaml").read_text())
    [job] = yaml.safe_load_all((K8S / "learner-job.yaml").read_text())
    assert (cluster["apiVersion"], cluster["kind"]) == ("kubernetes.dask.org/v1", "DaskCluster")
    [worker] = cluster["spec"]["worker"]["spec"]["containers"]
    [scheduler] = cluster["spec"]["scheduler"]["spec"]["containers"]
    assert worker["args"][:3] == ["worker", "--name", "$(DASK_WORKER_NAME)"]
    assert scheduler["args"][0] == "scheduler"
    assert {"name": "DASKRL_DEVICE", "value": "cuda"} in worker["env"]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
    [learner] = job["spec"]["template"]["spec"]["containers"]
    assert learner["image"] == worker["image"] == scheduler["image"]  # one image, same versions
    name = cluster["metadata"]["name"]
    assert f"tcp://{name}-scheduler:8786" in learner["args"]  # the operator's service name
    # The store path is on the volume both mount.
    store = learner["args"][learner["args"].index("--store") + 1]
    mounts = {m["mountPath"] for m in worker["volumeMounts"]} & {
        m["mountPath"] for m in learner["volumeMounts"]}
    assert any(store.startswith(m + "/") for m in mounts), (store, mounts)
