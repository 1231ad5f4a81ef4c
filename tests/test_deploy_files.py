"""The container and Kubernetes recipes (deploy/docker, deploy/kubernetes) cannot run here (no
docker, no Kubernetes): check what can be checked, the entry point by running it. (The
Dockerfile and the manifests, read: tests/unit/test_deploy_files.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from deploy_recipes import DOCKER


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
