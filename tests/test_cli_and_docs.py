"""The command line and the code shown to users, run as users run them (the command through its
entry point ``daskrl.cli.main``, in this process: ``tests/cli_inprocess.py``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import torch
from cli_inprocess import daskrl_main

import daskrl
from daskrl.testing import TagPolicy

ROOT = Path(__file__).resolve().parents[1]


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_cli_collect_prints_a_summary_and_writes_the_store(tmp_path):
    store = tmp_path / "demo"
    # The embedded cluster as users get it: TLS (tls:// worker addresses), shared memory.
    out = daskrl_main("collect", "--env", "CartPole-v1", "--frames", "4096",
                      "--frames-per-batch", "1024", "--workers", "1", "--store", str(store),
                      "--no-progress", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "collected 4096 frames in 4 batches on 1 workers" in out.stdout
    assert re.search(r"episodes finished: \d+, mean return \(last 100\): \d+\.\d\d", out.stdout)
    assert re.search(r"^frames/s per worker: tls://[\d.:]+ \d+ \(\d+ stepping\)$", out.stdout,
                     re.M), out.stdout
    assert "weights to workers: shared memory\n" in out.stdout
    assert f"store: file://{store}" in out.stdout
    assert daskrl.open_store(str(store)).frames == 4096


def test_cli_collect_json_is_the_summary_and_a_second_run_is_announced(tmp_path):
    import json

    import daskrl as package

    store = tmp_path / "demo"
    # The embedded cluster: num_workers is the one worker --workers asked for.
    cmd = ["collect", "--env", "CartPole-v1", "--frames", "2048", "--frames-per-batch", "1024",
           "--workers", "1", "--store", str(store), "--json", "--no-tls"]
    runs = []
    for _ in range(2):
        out = daskrl_main(*cmd, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        runs.append((json.loads(out.stdout), out.stderr))  # stdout is exactly one JSON object
    (first, first_err), (second, second_err) = runs
    assert (first["run"], second["run"]) == (0, 1)
    assert first["frames"] == second["frames"] == 2048 and first["batches"] == 2
    assert first["store"] == f"file://{store}" and first["num_workers"] == 1
    assert "already holds" not in first_err
    assert "already holds 1 run(s) (0); this collection adds run 1" in second_err
    assert [r for r in daskrl.open_store(str(store)).runs()] == [0, 1]
    version = daskrl_main("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"daskrl {package.__version__}"


def test_cli_bad_input_is_a_clear_error(tmp_path):
    out = daskrl_main("collect", "--env", "CartPole-v1", "--frames", "1001", "--store",
                      str(tmp_path / "s"))
    assert out.returncode == 3  # a configuration error
    assert "daskrl: error: total_frames=1001 is not a multiple of envs_per_worker=8" in out.stderr


def test_readme_quickstart_runs(tmp_path):
    [code] = _python_blocks(ROOT / "README.md")
    script = tmp_path / "quickstart.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "10 batches, 40960 frames" in out.stdout


def test_store_format_doc_reader_uses_zarr_alone(tmp_path, inproc_client):
    url = str(tmp_path / "store")
    with daskrl.Collector("daskrl.testing:Counting-v0", TagPolicy(), url, client=inproc_client,
                          envs_per_worker=2, frames_per_batch=20, total_frames=40) as c:
        list(c)
    [code] = _python_blocks(ROOT / "docs" / "store-format.md")
    assert not re.search(r"^\s*(import|from)\s+daskrl", code, flags=re.M)  # zarr alone
    code = re.sub(r'URL = "[^"]*"', f"URL = {url!r}", code)
    namespace: dict = {}
    exec(compile(code, "store-format.md", "exec"), namespace)
    first = daskrl.open_store(url).load(0)
    assert set(namespace["batch"]) == set(first)
    for k, v in namespace["batch"].items():
        assert torch.equal(torch.from_numpy(v), first[k]), k
