"""The SLURM recipes of deploy/slurm/, run unmodified on a real one-node SLURM
(tests/slurm_bed.py) with only the documented small-site overrides: partition, CPUs, memory, no
GPU, the venv, loopback. Each collects exact frames into a store checked batch by batch.

The job-script tests at the top need no SLURM: they run the job script dask-jobqueue generates
with bash (the ``#SBATCH`` lines are comments to bash) and check what the worker it starts got.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import dask
import pytest
import torch
import yaml
from cli_cluster import (
    Processes,
    make_tls_files,
    mapped_semaphores,
    wait_for_file,
    wait_until_unnamed,
)

import daskrl
import daskrl.data
from daskrl import deploy
from daskrl.cli import main as cli_main
from daskrl.errors import MissingDependencyError
from daskrl.testing import check_episode_continuity

ROOT = Path(__file__).resolve().parents[1]
SLURM = ROOT / "deploy" / "slurm"
YAML = SLURM / "jobqueue.yaml"
SBATCH = SLURM / "sbatch"
VENV = sys.prefix  # the jobs' venv: the one running these tests
LOOPBACK = {"host": "127.0.0.1", "dashboard_address": ":0"}  # tests listen on loopback only
FRAMES, PER_BATCH, ENVS = 512, 128, 4
LIFETIME_S, STAGGER_S = 225 * 60, 5 * 60   # what jobqueue.yaml and slurm_cluster.py say


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    path.chmod(0o700)
    return path


def _recipe():
    spec = importlib.util.spec_from_file_location("slurm_cluster", SLURM / "slurm_cluster.py")
    recipe = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = recipe  # as an import would (its dataclass looks itself up)
    spec.loader.exec_module(recipe)
    return recipe


def small_site(tmp_path: Path, partition: str = "debug") -> dict:
    """The documented overrides of jobqueue.yaml for a small CPU-only site (SLURMCluster
    arguments), on loopback, with TLS keys and job logs in the test's directory."""
    return {
        "queue": partition,
        "job_cpu": 1,
        "memory": "2GiB",
        "job_extra_directives": [],                 # no GPU: no --gres
        "job_script_prologue": [f"source {VENV}/bin/activate", "export DASKRL_DEVICE=cpu"],
        "interface": "lo",
        "shared_temp_directory": str(_private_dir(tmp_path / "tls")),
        "log_directory": str(tmp_path / "logs"),
        "scheduler_options": {"dashboard_address": "127.0.0.1:0"},
    }


def as_cli_options(options: dict) -> list[str]:
    """The same overrides as ``daskrl ... --jobqueue-option KEY=VALUE`` arguments."""
    out = []
    for key, value in options.items():
        out += ["--jobqueue-option",
                f"{key.replace('_', '-')}={yaml.safe_dump(value, default_flow_style=True).strip()}"]
    return [a.removesuffix("\n...") for a in out]


def _worker_values():
    def worker_values(dask_worker) -> dict:  # nested: pickled by value, runs on any worker
        import os

        return {"lifetime": dask_worker.lifetime, "death_timeout": dask_worker.death_timeout,
                "address": dask_worker.address, "nthreads": dask_worker.state.nthreads,
                "local_directory": dask_worker.local_directory,
                "DASKRL_DEVICE": os.environ.get("DASKRL_DEVICE"),
                "SLURM_JOB_ID": os.environ.get("SLURM_JOB_ID"), "pid": os.getpid()}

    return worker_values


worker_values = _worker_values()
"""What a worker was started with, as the running worker has it."""


def check_worker_values(values: dict, lifetime_s: float = LIFETIME_S,
                        death_timeout: float | None = 120) -> None:
    assert lifetime_s - STAGGER_S <= values["lifetime"] <= lifetime_s + STAGGER_S, values
    assert values["death_timeout"] == death_timeout, values
    assert re.fullmatch(r"(tls|tcp)://127\.0\.0\.1:\d+", values["address"]), values
    assert values["nthreads"] == 1, values
    assert values["DASKRL_DEVICE"] == "cpu", values
    # the recipe's nanny preload: the semaphores of the queues the worker shares with its
    # nanny in use, their names gone (every test bed's workers run on this host)
    assert mapped_semaphores(values["pid"]) >= 6, values
    wait_until_unnamed(values["pid"])


def check_collected(url: str, frames: int = FRAMES, per_batch: int = PER_BATCH) -> None:
    """Exactly ``frames`` frames, each batch once, every episode continuous across batches."""
    store = daskrl.open_store(url)
    ids = store.batch_ids()
    assert store.frames == frames
    assert len(ids) == len(set(ids)) == frames // per_batch
    assert sum(h.frames for h in store) == frames
    spans = 0
    for ep in daskrl.data.episodes(store, complete_only=False):
        d = ep.data
        n = len(d["step"])
        assert torch.equal(d["step"], torch.arange(n)), ep.episode_id  # from reset, no gap
        assert torch.equal(d["next_observation"][:-1], d["observation"][1:]), ep.episode_id
        assert not (d["terminated"][:-1] | d["truncated"][:-1]).any()
        spans += len(ep.batch_ids) > 1
    assert spans, "no episode crossed a batch boundary: nothing checked continuity"


# --- job scripts, run by bash (no SLURM needed) -----------------------------------------------


def _start_job_script(script: str, tmp_path: Path, procs: Processes, name: str) -> None:
    path = tmp_path / f"{name}.sh"
    path.write_text(script)
    procs.start(name, ["bash", str(path)], {"PYTHONPATH": str(ROOT)})


@pytest.mark.timeout(180)
@pytest.mark.parametrize("recipe", ["jobqueue.yaml", "slurm_cluster.py"])
def test_job_script_starts_a_worker_with_the_recipe_values(recipe, tmp_path, monkeypatch):
    """The worker a recipe's job script starts really runs with its lifetime, stagger, death
    timeout, interface and one thread (a value dask cannot parse kills the worker here)."""
    site = small_site(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    if recipe == "jobqueue.yaml":
        d = deploy.connect("slurm", jobqueue_config=YAML, **site)
        client, cluster = d.client, d.cluster
    else:
        cluster = _recipe().slurm_cluster(**site, security=True)
        from distributed import Client
        client = Client(cluster, set_as_default=False)
    procs = Processes(tmp_path)
    try:
        assert client.scheduler.address.startswith("tls://127.0.0.1:")
        _start_job_script(cluster.job_script(), tmp_path, procs, "job")
        deadline = time.monotonic() + 120
        while not client.nthreads():
            assert time.monotonic() < deadline, procs.logs()
            assert procs.procs["job"].poll() is None, procs.logs()
            time.sleep(0.2)
        [values] = client.run(worker_values).values()
        check_worker_values(values)
        assert values["local_directory"].startswith(os.environ.get("TMPDIR", "/tmp"))
    finally:
        procs.kill_all()
        client.close()
        cluster.close()
        deploy.remove_worker_keys(cluster)
    assert not list((tmp_path / "tls").iterdir())  # the cluster's keys go with it
    assert not (tmp_path / "home" / ".daskrl-tls").exists()  # told where the keys go


def test_python_recipe_submits_the_same_job_as_the_yaml(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    recipe = _recipe()
    tls_dir = str(_private_dir(tmp_path / "tls"))
    settings = recipe.Settings(tls_dir=tls_dir)
    with recipe.slurm_cluster(settings, scheduler_options=LOOPBACK) as cluster:
        from_python = cluster.job_script()
    deploy.remove_worker_keys(cluster)
    with deploy.connect("slurm", jobqueue_config=YAML, scheduler_options=LOOPBACK,
                        shared_temp_directory=tls_dir) as d:
        from_yaml = d.cluster.job_script()

    def normalized(script: str) -> str:  # scheduler address and key file names differ
        script = re.sub(r"tls://127\.0\.0\.1:\d+", "ADDRESS", script)
        return re.sub(r"\.dask-jobqueue\.worker\.(\w+)\.\w+", r"KEY-\1", script)

    assert normalized(from_python) == normalized(from_yaml)
    assert "#SBATCH --gres=gpu:1" in from_yaml.splitlines()  # the defaults: a GPU site
    assert not (tmp_path / "home" / ".daskrl-tls").exists()  # told to use another directory
    assert not list(Path(tls_dir).iterdir())


def test_python_recipe_settings_come_from_flags_and_environment(monkeypatch):
    recipe = _recipe()
    monkeypatch.setenv("DASKRL_PARTITION", "debug")
    monkeypatch.setenv("DASKRL_GPUS", "0")
    args = recipe.parser().parse_args(["--cpus", "2", "--partition", "short"])
    assert (args.partition, args.gpus, args.cpus, args.memory) == ("short", 0, 2, "32GiB")
    assert recipe.Settings.from_env() == recipe.Settings(partition="debug", gpus=0)


def test_slurm_settings_that_would_leak_or_fail_are_clear_errors(tmp_path, monkeypatch):
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
        deploy.connect("slurm", jobqueue_config=YAML, shared_temp_directory=str(shared),
                       scheduler_options=LOOPBACK)
    with pytest.raises(daskrl.ConfigError, match=re.escape(
            "jobqueue_config '/nonexistent/jobqueue.yaml' does not exist.")):
        deploy.connect("slurm", jobqueue_config="/nonexistent/jobqueue.yaml")
    monkeypatch.setitem(sys.modules, "dask_jobqueue", None)  # as if not installed
    with pytest.raises(MissingDependencyError, match=re.escape(
            "cluster='slurm' needs dask-jobqueue, which is not installed: "
            'pip install "daskrl[slurm]"')):
        deploy.connect("slurm")


def test_cli_slurm_cluster_prints_its_job_script(tmp_path, capsys):
    site = as_cli_options({**small_site(tmp_path), "scheduler_options": LOOPBACK})
    assert cli_main(["info", "--cluster", "slurm", "--jobqueue-config", str(YAML), *site]) == 0
    out = capsys.readouterr().out
    assert out.startswith("job script:\n#!/usr/bin/env bash\n")
    assert "--gres" not in out and "#SBATCH -p debug" in out and "--interface lo" in out
    assert re.search(r"scheduler: tls://127\.0\.0\.1:\d+  \(0 workers\)", out)

    assert cli_main(["collect", "--env", "CartPole-v1", "--store", str(tmp_path / "s"),
                     "--cluster", "slurm"]) == 3  # a configuration error
    assert ("daskrl: error: --cluster slurm needs --workers N: how many workers (one per job "
            "as in deploy/slurm/jobqueue.yaml) to ask SLURM for.") in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["info", "--cluster", "slurm", "--jobqueue-option", "queue"])
    assert "--jobqueue-option takes KEY=VALUE" in capsys.readouterr().err


def test_learner_script_runs_on_the_embedded_local_cluster(tmp_path):
    store = tmp_path / "store"
    out = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "learner.py"), "--store", str(store),
         "--workers", "1", "--frames", "256", "--frames-per-batch", "128",
         "--envs-per-worker", "4"],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert re.search(r"batch 1 from tls://127\.0\.0\.1:\d+ \(cpu\): loss -?\d+\.\d+, "
                     r"weights v2, ", out.stdout), out.stdout
    assert f"done: 256 frames in {store}" in out.stdout
    assert "Converting a tensor with requires_grad=True to a scalar" not in out.stderr


def test_sbatch_scripts_shape_scheduler_workers_learner(tmp_path):
    """The sbatch scripts' bodies run by bash as SLURM would run them (on one node, TLS on);
    the real-SLURM run of the same scripts is test_sbatch_set_on_real_slurm."""
    for script in SBATCH.iterdir():
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0, script
    shared = tmp_path / "fsx"
    make_tls_files(shared / "tls")  # ca.pem, cert.pem, key.pem
    env = {
        "DASKRL_SBATCH_DIR": str(SBATCH), "DASKRL_SHARED": str(shared),
        "DASKRL_VENV": VENV, "DASKRL_TLS_DIR": str(shared / "tls"),
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
                    {**env, "CUDA_VISIBLE_DEVICES": "3,5", "SLURM_JOB_ID": "4243"})
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
        assert (tmp_path / "node-local" / "daskrl-4243").is_dir()
        procs.kill("gpu-workers")  # SIGTERM, as scancel sends: the node-local scratch goes too
        assert not (tmp_path / "node-local" / "daskrl-4243").exists()
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
    assert not (tmp_path / "node-local" / "daskrl-4242").exists()


# --- on the real SLURM ------------------------------------------------------------------------


@pytest.mark.slurm
@pytest.mark.timeout(120)
def test_slurm_bed_starts_runs_a_job_and_leaves_nothing_behind(tmp_path):
    """A bed of its own: a job that leaves a process running past its own end (setsid) is
    still gone after teardown, with the daemons and the bed's directory."""
    if os.geteuid() != 0:
        pytest.skip("the SLURM test bed runs slurmctld, slurmd and munged as root")
    from slurm_bed import bed_processes, slurm_bed

    with slurm_bed() as bed:
        print(f"SLURM bed started in {bed.start_seconds:.1f}s")
        job = bed.run("sbatch", "--parsable", "--wrap",
                      "setsid sleep 600 < /dev/null > /dev/null 2>&1 & srun hostname",
                      cwd=tmp_path).stdout.strip()
        jobs = bed.wait_until_all_ended(timeout=60)
        assert jobs[job]["JobState"] == "COMPLETED", jobs[job]
        assert (tmp_path / f"slurm-{job}.out").read_text().split() == [bed.node]
        assert any("sleep 600" in cmd for cmd in bed_processes(bed.directory).values())
        directory = bed.directory
    assert not bed_processes(directory)
    assert not directory.exists()
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(directory) not in ps and "sleep 600" not in ps, ps


def _daskrl(*args: str) -> list[str]:
    return [sys.executable, "-m", "daskrl.cli", *args]


def _job_env() -> dict[str, str]:
    """The learner's environment, which sbatch passes on to the jobs (--export=ALL)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TMPDIR", None)
    return env


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_cli_collects_exact_frames_with_jobqueue_yaml(slurm, tmp_path):
    store = tmp_path / "store"
    before = set(slurm.jobs())
    out = subprocess.run(
        _daskrl("collect", "--env", "CartPole-v1", "--store", str(store), "--frames",
                str(FRAMES), "--frames-per-batch", str(PER_BATCH), "--envs-per-worker",
                str(ENVS), "--workers", "2", "--no-progress", "--cluster", "slurm",
                "--jobqueue-config", str(YAML), *as_cli_options(small_site(tmp_path))),
        capture_output=True, text=True, timeout=280, cwd=tmp_path, env=_job_env())
    assert out.returncode == 0, out.stderr + slurm.logs()
    assert re.search(rf"collected {FRAMES} frames in {FRAMES // PER_BATCH} batches on 2 "
                     "workers", out.stdout), out.stdout
    check_collected(str(store))
    assert not list((tmp_path / "tls").iterdir())
    jobs = {k: j for k, j in slurm.jobs().items() if k not in before}
    assert [j["JobName"] for j in jobs.values()] == ["daskrl-worker"] * 2, jobs
    assert {j["JobState"] for j in jobs.values()} <= {"CANCELLED", "COMPLETED"}, jobs


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_deploy_connect_collects_exact_frames_with_jobqueue_yaml(slurm, tmp_path,
                                                                 cartpole_policy, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    with deploy.connect("slurm", workers=2, jobqueue_config=YAML, **small_site(tmp_path)) as d:
        d.wait_for_workers(2, timeout=240)
        values = d.client.run(worker_values)
        for v in values.values():
            check_worker_values(v)
        job_ids = {v["SLURM_JOB_ID"] for v in values.values()}
        assert len(job_ids) == 2 and job_ids <= set(slurm.jobs())  # one worker per job
        with daskrl.Collector("CartPole-v1", cartpole_policy, str(tmp_path / "store"),
                              client=d.client, envs_per_worker=ENVS, frames_per_batch=PER_BATCH,
                              total_frames=FRAMES) as collector:
            for _ in collector:
                collector.update_weights(cartpole_policy)
        assert len(list((tmp_path / "tls").iterdir())) == 3  # CA, certificate, key
    check_collected(str(tmp_path / "store"))
    assert not list((tmp_path / "tls").iterdir())
    jobs = slurm.wait_until_all_ended(timeout=60)  # closing cancelled them
    assert {jobs[j]["JobState"] for j in job_ids} <= {"CANCELLED", "COMPLETED"}


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_slurmcluster_directly_with_jobqueue_yaml_as_dask_config(slurm, tmp_path,
                                                                  cartpole_policy, monkeypatch):
    """dask-jobqueue without daskrl.deploy: the YAML as dask config, the site's overrides as
    SLURMCluster arguments."""
    from dask_jobqueue import SLURMCluster
    from distributed import Client

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    section = yaml.safe_load(YAML.read_text())["jobqueue"]["slurm"]
    config = {f"jobqueue.slurm.{k}": v for k, v in section.items()}
    with dask.config.set(config):
        cluster = SLURMCluster(security=True, **small_site(tmp_path))
        try:
            cluster.scale(2)
            with Client(cluster, set_as_default=False) as client:
                deploy.wait_for_slurm_workers(client, cluster, 2, timeout=240)
                for v in client.run(worker_values).values():
                    check_worker_values(v)
                with daskrl.Collector("CartPole-v1", cartpole_policy, str(tmp_path / "store"),
                                      client=client, envs_per_worker=ENVS,
                                      frames_per_batch=PER_BATCH, total_frames=FRAMES) as c:
                    for _ in c:
                        pass
        finally:
            cluster.close()
            deploy.remove_worker_keys(cluster)
    check_collected(str(tmp_path / "store"))


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_slurm_cluster_py_collects_exact_frames_with_site_settings(slurm, tmp_path):
    home = tmp_path / "home"
    store = tmp_path / "store"
    env = {**_job_env(), "HOME": str(home), "DASKRL_PARTITION": slurm.partition,
           "DASKRL_GPUS": "0"}
    out = subprocess.run(
        [sys.executable, str(SLURM / "slurm_cluster.py"), "--cpus", "1", "--memory", "2GiB",
         "--venv", VENV, "--interface", "lo", "--dashboard", "127.0.0.1:0",
         "--tls-dir", str(_private_dir(tmp_path / "tls")), "--log-directory",
         str(tmp_path / "logs"), "--workers", "2", "--store", str(store), "--frames",
         str(FRAMES), "--frames-per-batch", str(PER_BATCH), "--envs-per-worker", str(ENVS)],
        capture_output=True, text=True, timeout=280, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr + slurm.logs()
    assert f"done: {FRAMES} frames in {store}" in out.stdout
    check_collected(str(store))
    assert not (home / ".daskrl-tls").exists()  # told --tls-dir
    assert not list((tmp_path / "tls").iterdir())
    logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert logs and all(re.fullmatch(r"daskrl-worker-\d+\.(out|err)", n) for n in logs), logs


@pytest.mark.slurm
@pytest.mark.timeout(360)
def test_sbatch_set_on_real_slurm(slurm, tmp_path):
    """submit.sh: scheduler, workers and learner as three jobs, sized by sbatch flags."""
    shared = tmp_path / "fsx"
    make_tls_files(shared / "tls")
    cpus = min(2, slurm.cpus)
    env = {**_job_env(), "DASKRL_SHARED": str(shared), "DASKRL_VENV": VENV,
           "DASKRL_TLS_DIR": str(shared / "tls"), "DASKRL_HOST": "127.0.0.1",
           "DASKRL_SCHEDULER_PORT": "0", "DASKRL_DASHBOARD": "127.0.0.1:0",
           "DASKRL_CPU_WORKERS": "2",
           "DASKRL_SBATCH_ARGS": f"--partition={slurm.partition}",
           "DASKRL_SCHEDULER_SBATCH_ARGS": "--mem=1G",
           "DASKRL_WORKERS_SBATCH_ARGS": f"--nodes=1 --gres=none --cpus-per-task={cpus} --mem=4G",
           "DASKRL_LEARNER_SBATCH_ARGS": "--gres=none --cpus-per-task=1 --mem=2G"}
    out = subprocess.run(
        ["bash", str(SBATCH / "submit.sh"), "--frames", str(FRAMES), "--frames-per-batch",
         str(PER_BATCH), "--envs-per-worker", str(ENVS), "--wait-for-workers", "2"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    sched, workers, learner = re.search(
        r"scheduler job (\d+), workers job (\d+), learner job (\d+)", out.stdout).groups()
    jobs = slurm.jobs()
    assert jobs[sched]["JobName"] == "daskrl-scheduler" and jobs[sched]["MinMemoryNode"] == "1G"
    assert jobs[workers]["NumCPUs"] == str(cpus), jobs[workers]
    assert jobs[workers]["NumNodes"] in ("1", "1-1"), jobs[workers]
    assert "gres" not in jobs[workers].get("TRES", ""), jobs[workers]

    deadline = time.monotonic() + 300
    while (state := slurm.jobs()[learner]["JobState"]) not in slurm_ended():
        assert time.monotonic() < deadline, slurm.jobs()
        time.sleep(1)
        # The learner job runs from its start, while it waits for the scheduler job to write
        # its file (scheduler.sbatch's python may still be importing): check once it has.
        if (state == "RUNNING" and not (shared / "checked").exists()
                and _scheduler_written(shared / "scheduler.json")):
            tls = shared / "tls"
            security = deploy.tls_security(str(tls / "ca.pem"), str(tls / "cert.pem"),
                                           str(tls / "key.pem"))
            with deploy.connect(scheduler_file=shared / "scheduler.json",
                                security=security) as d:
                d.client.wait_for_workers(2, timeout=120)
                values = d.client.run(worker_values)
            for v in values.values():  # workers.sbatch's lifetime, really taken
                check_worker_values(v, lifetime_s=230 * 60, death_timeout=None)
                assert v["SLURM_JOB_ID"] == workers
                assert v["local_directory"].startswith(f"/tmp/daskrl-{workers}/"), v
            (shared / "checked").touch()
    log = (tmp_path / f"daskrl-learner-{learner}.out").read_text()
    assert state == "COMPLETED", log + slurm.logs()
    store = shared / "runs" / f"run-{learner}"
    assert f"done: {FRAMES} frames in {store}" in log
    check_collected(str(store))
    assert (shared / "checked").exists()
    slurm.cancel_all()  # scheduler and workers run until cancelled
    assert not Path(f"/tmp/daskrl-{workers}").exists()  # start-workers.sh cleaned up


def _scheduler_written(path: Path) -> bool:
    """Whether the scheduler has written its whole file (an address), as learner.sbatch waits."""
    try:
        return bool(json.loads(path.read_text())["address"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _frames(store: Path) -> int:
    try:
        return daskrl.open_store(str(store)).frames
    except daskrl.DaskrlError:  # not there yet
        return 0


def slurm_ended() -> set[str]:
    from slurm_bed import ENDED_STATES

    return ENDED_STATES


@pytest.mark.slurm
@pytest.mark.timeout(240)
def test_cli_gives_up_with_the_job_log_when_workers_die_at_start(slurm, tmp_path):
    """The recipe as it was (lifetime 3h45m, which this dask cannot parse): each worker dies
    at start. The CLI stops at the first ended job with its state and log, not after an hour."""
    site = {**small_site(tmp_path), "worker_extra_args": ["--lifetime", "3h45m"]}
    out = subprocess.run(
        _daskrl("collect", "--env", "CartPole-v1", "--store", str(tmp_path / "store"),
                "--workers", "1", "--no-progress", "--cluster", "slurm", "--jobqueue-config",
                str(YAML), *as_cli_options(site)),
        capture_output=True, text=True, timeout=220, cwd=tmp_path, env=_job_env())
    assert out.returncode == 1, out.stdout + out.stderr  # a runtime error: the jobs ended
    err = out.stderr
    assert re.search(r"daskrl: error: 1 of 1 SLURM worker jobs ended before 1 Dask worker\(s\) "
                     r"joined \(joined: 0\)", err), err
    assert re.search(r"SLURM job \d+ \(daskrl-worker\) ended (FAILED|COMPLETED) \(exit code "
                     r"\d+:\d+, reason \S+\) on " + slurm.node, err), err
    assert re.search(rf"the last lines of {tmp_path}/logs/daskrl-worker-\d+\.err:", err), err
    assert "could not convert string to float: '3h45'" in err, err
    assert not list((tmp_path / "tls").iterdir())


@pytest.mark.slurm
@pytest.mark.timeout(120)
def test_a_job_this_slurm_cannot_run_is_refused_before_it_queues(slurm, tmp_path, capsys):
    """The unmodified recipe asks for a GPU partition, a GPU and 32 GiB: sbatch --test-only
    says which part this SLURM refuses, and nothing is queued."""
    tls = str(_private_dir(tmp_path / "tls"))
    before = set(slurm.jobs())
    with pytest.raises(daskrl.SlurmJobError, match=r"(?s)SLURM refuses the worker job: "
                       r"sbatch: error: Invalid generic resource \(gres\) specification\n"
                       r"Its directives:\n.*#SBATCH -p gpu\n.*#SBATCH --gres=gpu:1"):
        deploy.connect("slurm", workers=1, jobqueue_config=YAML, shared_temp_directory=tls,
                       scheduler_options=LOOPBACK)
    assert cli_main(["collect", "--env", "CartPole-v1", "--store", str(tmp_path / "s"),
                     "--workers", "1", "--cluster", "slurm", "--jobqueue-config", str(YAML),
                     *as_cli_options({**small_site(tmp_path / "x"), "memory": "64TiB"})]) == 1
    err = capsys.readouterr().err
    assert "SLURM refuses the worker job: allocation failure: Requested node configuration is " \
           "not available" in err, err
    assert "#SBATCH --mem=65536G" in err, err
    assert set(slurm.jobs()) == before
    assert not list(Path(tls).iterdir())


@pytest.mark.slurm
@pytest.mark.timeout(240)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_killed_cli_cancels_its_jobs_and_deletes_its_keys(slurm, tmp_path, sig):
    tls = tmp_path / "tls"
    store = tmp_path / "store"
    before = set(slurm.jobs())
    proc = subprocess.Popen(
        _daskrl("collect", "--env", "CartPole-v1", "--store", str(store), "--frames",
                "100000000", "--frames-per-batch", str(PER_BATCH), "--envs-per-worker",
                str(ENVS), "--workers", "1", "--no-progress", "--cluster", "slurm",
                "--jobqueue-config", str(YAML), *as_cli_options(small_site(tmp_path))),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
        env=_job_env())
    try:
        deadline = time.monotonic() + 180
        while not _frames(store):
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, slurm.logs()
            time.sleep(0.5)
        assert len(list(tls.iterdir())) == 3
        proc.send_signal(sig)
        output = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == (130 if sig == signal.SIGINT else 128 + signal.SIGTERM), output
    assert not list(tls.iterdir()), output  # no TLS key left on the shared filesystem
    jobs = {k: j for k, j in slurm.wait_until_all_ended(timeout=30).items() if k not in before}
    assert len(jobs) == 1 and {j["JobState"] for j in jobs.values()} <= {"CANCELLED",
                                                                         "COMPLETED"}, jobs
    check_episode_continuity(daskrl.open_store(str(store)))  # what it committed is whole
