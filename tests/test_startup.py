"""Start-up: ``import daskrl`` and the ``daskrl`` command's modules import no heavy dependency
until a name needs it (PEP 562 ``__getattr__`` in daskrl, daskrl.collect, daskrl.store and
daskrl.worker) while every public name still resolves; the embedded cluster's workers import
their side as they start; ``daskrl collect`` starts the embedded cluster while the learner
builds the policy, and a policy factory that fails then still exits 3 leaving no process; a
program read from standard input, which spawned workers cannot import, is refused before any
worker starts (and runs when the workers fork)."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import daskrl

pytestmark = pytest.mark.timeout(300)

HEAVY = ("torch", "gymnasium", "distributed", "zarr", "torchrl", "tensorboard", "xarray",
         "matplotlib")


def _imported_after(statement: str) -> list[str]:
    """Which of :data:`HEAVY` a fresh interpreter holds after running ``statement``."""
    code = (f"import sys, json\n{statement}\n"
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=100)
    return list(json.loads(out.stdout.splitlines()[-1]))


def test_import_daskrl_imports_no_heavy_dependency():
    assert _imported_after("import daskrl") == []


def test_the_command_imports_no_torch_before_it_runs():
    # what `daskrl collect` imports before it starts the embedded cluster: the parser (the
    # generated options), the config check, the env check
    imported = _imported_after(
        "import daskrl.cli, daskrl.cli._app as app, daskrl.collect._env_list\n"
        "from daskrl.config import CollectorConfig\n"
        "app._parser().parse_args(['collect', '--env', 'CartPole-v1', '--store', 'x'])\n"
        "CollectorConfig()")
    assert "torch" not in imported, imported
    assert "zarr" not in imported, imported


@pytest.mark.parametrize("name", daskrl.__all__)
def test_every_public_name_resolves_to_its_module_object(name):
    value = getattr(daskrl, name)
    module = getattr(value, "__module__", None)
    if isinstance(value, type) or callable(value):
        assert module is not None and module.startswith("daskrl."), (name, module)
        assert getattr(importlib.import_module(module), name.split(".")[-1], value) is value
    assert name in dir(daskrl)


def test_public_imports_and_subpackages_work_as_before():
    code = ("import daskrl\n"
            "from daskrl import Collector, BatchHandle, open_store, CollectorConfig, snapshot\n"
            "from daskrl.collect._collector import Collector as C\n"
            "from daskrl.store._store import open_store as o\n"
            "assert Collector is C and open_store is o\n"
            "assert daskrl.deploy.local_cluster and daskrl.store.TrajectoryStore\n"
            "assert daskrl.collect.Collector is C and daskrl.worker.resolve_device\n"
            "import daskrl.store as s\n"
            "assert set(s.__all__) <= set(dir(s)) and all(getattr(s, n) for n in s.__all__)\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=100)
    assert out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize("module", ["daskrl", "daskrl.store", "daskrl.collect",
                                    "daskrl.worker"])
def test_an_unknown_attribute_is_an_attribute_error(module):
    m = importlib.import_module(module)
    with pytest.raises(AttributeError, match="no_such_name"):
        m.no_such_name  # noqa: B018
    assert not hasattr(m, "no_such_name")


def test_embedded_workers_import_their_side_but_nothing_learner_only():
    from distributed import Client

    from daskrl.deploy import local_cluster

    def modules() -> dict[str, bool]:
        import sys

        return {m: m in sys.modules for m in ("torch", "daskrl.worker._tasks",
                                              "daskrl.collect._collector",
                                              "daskrl.data._transitions")}

    with local_cluster(1, tls=False) as cluster, Client(cluster, set_as_default=False) as c:
        (seen,) = c.run(modules).values()
    assert seen == {"torch": True, "daskrl.worker._tasks": True,
                    "daskrl.collect._collector": False, "daskrl.data._transitions": False}, seen


FACTORY = """
import os, time
import psutil
from daskrl.policies import MLPPolicy

def make(observation_space, action_space):
    # the embedded cluster's worker processes, children of this learner, while it builds
    # the policy (waits for them for a while: they start in another thread)
    deadline = time.monotonic() + 60
    n = 0
    while time.monotonic() < deadline and n < 2:
        n = 0
        for p in psutil.Process().children(recursive=True):
            try:  # spawned, or forked by the forkserver
                n += ("spawn_main" in " ".join(p.cmdline())
                      or "multiprocessing.forkserver" in " ".join(p.parent().cmdline()))
            except (psutil.Error, AttributeError):  # ended meanwhile
                pass
        time.sleep(0.05)
    with open(os.environ["FACTORY_OUT"], "w") as f:
        f.write(str(n))
    if os.environ.get("FACTORY_FAIL"):
        raise RuntimeError("injected factory failure")
    return MLPPolicy(observation_space, action_space)
"""


def _collect_with_factory(tmp_path, fail: bool) -> tuple[subprocess.CompletedProcess, int]:
    (tmp_path / "startup_factory.py").write_text(textwrap.dedent(FACTORY))
    env = {**os.environ, "FACTORY_OUT": str(tmp_path / "children"),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    if fail:
        env["FACTORY_FAIL"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "daskrl.cli", "collect", "--env", "CartPole-v1", "--store",
         str(tmp_path / "s"), "--policy", "startup_factory:make", "--workers", "2",
         "--frames-per-batch", "64", "--frames", "128", "--no-progress"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # nothing of the command is left: its process group is gone
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("a process of the command outlived it")
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done, int((tmp_path / "children").read_text())


def test_the_command_starts_the_embedded_cluster_while_it_builds_the_policy(tmp_path):
    out, children = _collect_with_factory(tmp_path, fail=False)
    assert out.returncode == 0, out.stderr
    assert children == 2  # both worker processes started before the policy was built
    assert len(daskrl.open_store(str(tmp_path / "s"))) == 2


def test_a_failing_policy_factory_exits_3_and_closes_the_early_cluster(tmp_path):
    from daskrl.cli._exit import CONFIG

    out, children = _collect_with_factory(tmp_path, fail=True)
    assert out.returncode == CONFIG, out
    assert out.stderr.splitlines()[-1].startswith(
        "daskrl: error: --policy 'startup_factory:make' raised when called with the env's "
        "spaces: RuntimeError: injected factory failure"), out.stderr
    assert children == 2
    assert not (tmp_path / "s").exists()  # no batch, no store: refused before collecting


# A program read from standard input, as `python - <<EOF` runs one: it collects one batch on
# the embedded cluster, whose workers import the program's main module again unless forked.
STDIN_PROGRAM = """
import gymnasium as gym, sys
import daskrl
from daskrl.policies import MLPPolicy

env = gym.make("CartPole-v1")
policy = MLPPolicy(env.observation_space, env.action_space)
with daskrl.Collector("CartPole-v1", policy, sys.argv[1], num_workers=1, envs_per_worker=2,
                      frames_per_batch=64, total_frames=64) as collector:
    print("batches", sum(1 for _ in collector))
"""


def _run_from_stdin(store: str, program: str = STDIN_PROGRAM,
                    **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-", store], input=program, text=True,
                          capture_output=True, timeout=200, env={**os.environ, **env})


@pytest.mark.parametrize("program", [STDIN_PROGRAM, "from daskrl.deploy import local_cluster\n"
                                     "local_cluster(1)\n"], ids=["Collector", "local_cluster"])
def test_a_program_read_from_stdin_is_refused_before_any_worker_starts(tmp_path, program):
    # Spawned and forkserver workers import the main module again: '<stdin>' made every
    # nanny fail with a FileNotFoundError deep in multiprocessing ("Nanny failed to start").
    out = _run_from_stdin(str(tmp_path / "s"), program=program)
    assert out.returncode == 1, out
    last = out.stderr.splitlines()[-1]
    assert last.startswith("daskrl.errors.ConfigError: the embedded cluster's worker processes "
                           "start by importing this program's main module, and this program "
                           "was read from <stdin>"), out.stderr
    assert "save it to a file and run that file" in last
    assert "Nanny" not in out.stderr and "FileNotFoundError" not in out.stderr, out.stderr
    assert not (tmp_path / "s").exists()


def test_a_program_read_from_stdin_collects_when_workers_fork(tmp_path):
    # Forked workers inherit the main module instead of importing it: nothing to refuse.
    out = _run_from_stdin(str(tmp_path / "s"),
                          DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD="fork")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "batches 1"
    assert len(daskrl.open_store(str(tmp_path / "s"))) == 1
