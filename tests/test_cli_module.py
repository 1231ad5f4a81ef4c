"""``python -m daskrl`` runs the ``daskrl`` command, in a subprocess: its help, a real command
on a store, and a usage error's exit status."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from daskrl.cli._exit import USAGE

pytestmark = pytest.mark.timeout(120)

STORE = Path(__file__).parent / "data" / "store-2.2"


def _python_m_daskrl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "daskrl", *args], capture_output=True,
                          text=True, timeout=90, cwd=cwd)


def test_help(tmp_path):
    out = _python_m_daskrl("--help", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: daskrl ")
    assert "{collect,info,inspect,gc,prune,export}" in out.stdout


def test_inspect_a_store(tmp_path):
    shutil.copytree(STORE, tmp_path / "s")
    out = _python_m_daskrl("inspect", "s", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "batches:           5" in out.stdout and "frames:            20" in out.stdout


def test_a_usage_error_exits_with_its_status(tmp_path):
    out = _python_m_daskrl("collcet", cwd=tmp_path)
    assert out.returncode == USAGE
    assert "daskrl: error: argument command: invalid choice: 'collcet'" in out.stderr
