"""The container and Kubernetes recipes (deploy/docker, deploy/kubernetes), read: the files the
Dockerfile copies and the extras it installs exist, and the manifests fit together. (The entry
point, run: tests/test_deploy_files.py.)"""

from __future__ import annotations

import re

import yaml
from deploy_recipes import DOCKER, K8S, ROOT


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
