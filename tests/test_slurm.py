"""SLURM recipes, as far as a machine without SLURM allows: the job scripts dask-jobqueue would
submit, the sbatch scripts run by bash (no sbatch/srun here), the learner on a LocalCluster."""

from __future__ import annotations

import importlib.util
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cli_cluster import Processes, make_tls_files, wait_for_file

import daskrl
from daskrl import deploy
from daskrl.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[1]
SLURM = ROOT / "deploy" / "slurm"
SBATCH = SLURM / "sbatch"
LOOPBACK = {"host": "127.0.0.1", "dashboard_address": ":0"}  # tests listen on loopback only


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700)
    return path


EXPECTED_JOB_LINES = [
    "#SBATCH -J daskrl-worker",
    "#SBATCH -p gpu",
    "#SBATCH --cpus-per-task=8",
    "#SBATCH --mem=32G",
    "#SBATCH -t 04:00:00",
    "#SBATCH --gres=gpu:1",
    "source ~/venvs/daskrl/bin/activate",
    "export DASKRL_DEVICE=cuda",
]


def _worker_command(script: str) -> str:
    [line] = [ln for ln in script.splitlines() if "distributed.cli.dask_worker" in ln]
    return line


def _check_job_script(script: str, tls_dir: str) -> None:
    lines = script.splitlines()
    for expected in EXPECTED_JOB_LINES:
        assert expected in lines, (expected, script)
    cmd = _worker_command(script)
    # One thread per worker; retire before the walltime, staggered; scratch on the node.
    for part in ("--nthreads 1 ", "--lifetime 3h45m --lifetime-stagger 5m",
                 "--death-timeout 120", "--local-directory ${TMPDIR:-/tmp}",
                 "--protocol tls://"):
        assert part in cmd, (part, cmd)
    # The prologue (venv, device) runs before the worker starts.
    assert lines.index("export DASKRL_DEVICE=cuda") < lines.index(cmd)
    # TLS: the workers' CA, certificate and key were written to the private shared directory.
    for flag in ("--tls-ca-file", "--tls-cert", "--tls-key"):
        path = re.search(rf"{flag} (\S+)", cmd).group(1)
        assert path.startswith(f"{tls_dir}/.dask-jobqueue.worker."), path
        mode = stat.S_IMODE(os.stat(os.path.expanduser(path)).st_mode)
        assert mode == 0o600, oct(mode)


def test_jobqueue_yaml_gives_the_job_script_hpc_users_need(tmp_path):
    tls_dir = _private_dir(tmp_path / "tls")
    with deploy.connect("slurm", jobqueue_config=SLURM / "jobqueue.yaml",
                        scheduler_options=LOOPBACK, shared_temp_directory=str(tls_dir)) as d:
        assert d.client.scheduler.address.startswith("tls://127.0.0.1:")
        script = d.cluster.job_script()
        _check_job_script(script, str(tls_dir))
    assert not list(tls_dir.iterdir())  # the cluster's keys go with it


def test_python_recipe_submits_the_same_job_as_the_yaml(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("slurm_cluster", SLURM / "slurm_cluster.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    tls_dir = _private_dir(tmp_path / "tls")
    monkeypatch.setattr(recipe, "TLS_DIR", str(tls_dir))
    with recipe.slurm_cluster(scheduler_options=LOOPBACK) as cluster:
        from_python = cluster.job_script()
    _check_job_script(from_python, str(tls_dir))
    with deploy.connect("slurm", jobqueue_config=SLURM / "jobqueue.yaml",
                        scheduler_options=LOOPBACK, shared_temp_directory=str(tls_dir)) as d:
        from_yaml = d.cluster.job_script()

    def normalized(script: str) -> str:  # scheduler address and key file names differ
        script = re.sub(r"tls://127\.0\.0\.1:\d+", "ADDRESS", script)
        return re.sub(r"\.dask-jobqueue\.worker\.(\w+)\.\w+", r"KEY-\1", script)

    assert normalized(from_python) == normalized(from_yaml)


def test_slurm_settings_that_would_leak_or_fail_are_clear_errors(tmp_path, monkeypatch):
    config = SLURM / "jobqueue.yaml"
    with pytest.raises(daskrl.ConfigError, match=re.escape(
            "TLS on SLURM (the default) writes the workers' keys to a directory the compute "
            "nodes can read: set jobqueue.slurm.shared-temp-directory")):
        deploy.connect("slurm", scheduler_options=LOOPBACK)  # dask's defaults: no directory
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with pytest.raises(daskrl.ConfigError, match=re.escape(
            f"shared_temp_directory {str(shared)!r} has mode 755; the cluster's keys go there "
            f"and whoever reads them can run code on your workers. Run `chmod 700 {shared}`")):
        deploy.connect("slurm", jobqueue_config=config, shared_temp_directory=str(shared),
                       scheduler_options=LOOPBACK)
    with pytest.raises(daskrl.ConfigError, match=re.escape(
            "jobqueue_config '/nonexistent/jobqueue.yaml' does not exist.")):
        deploy.connect("slurm", jobqueue_config="/nonexistent/jobqueue.yaml")
    monkeypatch.setitem(sys.modules, "dask_jobqueue", None)  # as if not installed
    with pytest.raises(daskrl.DaskrlError, match=re.escape(
            "cluster='slurm' needs dask-jobqueue, which is not installed: "
            'pip install "daskrl[slurm]"')):
        deploy.connect("slurm")


def test_cli_slurm_cluster_prints_its_job_script(tmp_path, capsys):
    config = yaml.safe_load((SLURM / "jobqueue.yaml").read_text())
    config["jobqueue"]["slurm"]["scheduler-options"] = LOOPBACK
    config["jobqueue"]["slurm"]["shared-temp-directory"] = str(_private_dir(tmp_path / "tls"))
    (tmp_path / "jobqueue.yaml").write_text(yaml.safe_dump(config))
    assert cli_main(["info", "--cluster", "slurm", "--jobqueue-config",
                     str(tmp_path / "jobqueue.yaml")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("job script:\n#!/usr/bin/env bash\n")
    assert "#SBATCH --gres=gpu:1" in out
    assert re.search(r"scheduler: tls://127\.0\.0\.1:\d+  \(0 workers\)", out)

    assert cli_main(["collect", "--env", "CartPole-v1", "--store", str(tmp_path / "s"),
                     "--cluster", "slurm"]) == 2
    assert ("daskrl: error: --cluster slurm needs --workers N: how many workers (one per job "
            "as in deploy/slurm/jobqueue.yaml) to ask SLURM for.") in capsys.readouterr().err


def test_learner_script_runs_on_the_embedded_local_cluster(tmp_path):
    store = tmp_path / "store"
    out = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "learner.py"), "--store", str(store), "--workers", "1",
         "--frames", "256", "--frames-per-batch", "128", "--envs-per-worker", "4"],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert re.search(r"batch 1 from tls://127\.0\.0\.1:\d+ \(cpu\): loss -?\d+\.\d+, "
                     r"weights v2, ", out.stdout), out.stdout
    assert f"done: 256 frames in {store}" in out.stdout


def test_sbatch_scripts_shape_scheduler_workers_learner(tmp_path):
    """The sbatch scripts' bodies run by bash as SLURM would run them (on one node, TLS on)."""
    for script in SBATCH.iterdir():
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0, script
    shared = tmp_path / "fsx"
    make_tls_files(shared / "tls")  # ca.pem, cert.pem, key.pem
    env = {
        "DASKRL_SBATCH_DIR": str(SBATCH), "DASKRL_SHARED": str(shared),
        "DASKRL_VENV": sys.prefix, "DASKRL_TLS_DIR": str(shared / "tls"),
        "DASKRL_HOST": "127.0.0.1", "DASKRL_SCHEDULER_PORT": "0", "DASKRL_DASHBOARD": ":0",
        "SLURM_JOB_ID": "4242", "TMPDIR": str(tmp_path / "node-local"),
    }
    (tmp_path / "node-local").mkdir()
    procs = Processes(tmp_path)
    try:
        procs.start("scheduler", ["bash", str(SBATCH / "scheduler.sbatch")], env)
        procs.start("cpu-workers", ["bash", str(SBATCH / "start-workers.sh")],
                    {**env, "DASKRL_CPU_WORKERS": "2"})
        # GPU mode on a node whose job got GPUs 3 and 5: a worker per GPU, each seeing only
        # its own (no GPU here, so their device cannot resolve; collection uses the others).
        procs.start("gpu-workers", ["bash", str(SBATCH / "start-workers.sh")],
                    {**env, "CUDA_VISIBLE_DEVICES": "3,5"})
        wait_for_file(shared / "scheduler.json", procs)
        tls = shared / "tls"
        security = deploy.tls_security(str(tls / "ca.pem"), str(tls / "cert.pem"),
                                       str(tls / "key.pem"))
        with deploy.connect(scheduler_file=shared / "scheduler.json", security=security) as d:
            d.client.wait_for_workers(4, timeout=120)
            report = deploy.worker_report(d.client)
        host = os.uname().nodename.split(".")[0]
        by_name = {r["name"]: r for r in report.values()}
        assert sorted(by_name) == sorted(f"{host}-{w}" for w in ("cpu0", "cpu1", "gpu3", "gpu5"))
        for gpu in ("3", "5"):
            r = by_name[f"{host}-gpu{gpu}"]
            assert (r["CUDA_VISIBLE_DEVICES"], r["DASKRL_DEVICE"]) == (gpu, "cuda")
            assert r["device"].startswith("error: worker ") and "sees no CUDA GPU" in r["device"]
        for cpu in ("cpu0", "cpu1"):
            r = by_name[f"{host}-{cpu}"]
            assert (r["CUDA_VISIBLE_DEVICES"], r["DASKRL_DEVICE"], r["device"]) == ("", "cpu",
                                                                                  "cpu")
            assert r["threads"] == "1"
        procs.kill("gpu-workers")
        out = subprocess.run(
            ["bash", str(SBATCH / "learner.sbatch"), "--frames", "256", "--frames-per-batch",
             "64", "--envs-per-worker", "4", "--wait-for-workers", "2"],
            capture_output=True, text=True, timeout=240, env={**os.environ, **env},
        )
        assert out.returncode == 0, out.stderr + procs.logs()
        store = shared / "runs" / "run-4242"
        assert f"done: 256 frames in {store}" in out.stdout
        workers = {h.worker for h in daskrl.open_store(str(store))}
        assert {w.split("://")[0] for w in workers} == {"tls"}
        assert len(workers) == 2
        assert (tmp_path / "node-local" / "daskrl-4242" / f"{host}-cpu0").is_dir()
    finally:
        procs.kill_all()
