"""Where the container and Kubernetes recipes are: shared by tests/test_deploy_files.py and
tests/unit/test_deploy_files.py."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "deploy" / "docker"
K8S = ROOT / "deploy" / "kubernetes"
