"""Shared fixtures, and the test tiers.

Every test gets exactly one tier marker, applied here at collection (see docs/architecture.md,
"Test tiers"):

- ``unit``: every test under ``tests/unit/``, and only those (``-m unit`` collects only
  that directory). No Dask at all: while one runs (fixtures
  included) starting a process, opening a TCP/IP socket, starting a Dask server (scheduler,
  worker, nanny) or importing ``distributed`` for the first time fails the test, and it gets a
  default ``timeout`` of ``UNIT_TIMEOUT_S`` seconds. The whole tier runs in ``UNIT_BUDGET_S``.
- ``cluster``: in-process clusters: tests written with ``gen_cluster`` or ``gen_test``
  (``from conftest import gen_cluster``; detected as a plain test function wrapping a coroutine
  function), or using the ``inproc_client`` (or ``cleanup``) fixture, and none of the system
  fixtures or markers below.
- ``system``: everything else: process clusters (the ``client``/``cluster`` fixtures), CLI
  subprocesses, SLURM (``slurm``), namespace hosts (``hosts``), examples (``slow``).

A test may name its tier itself (``@pytest.mark.system``) where the rule cannot see it (an
in-process cluster that also starts a subprocess); a tier mark on a test under ``tests/unit/``
is an error. Tests run in tier order (unit, cluster, system): fast feedback first, and
``gen_cluster``'s leak checks (it ends every child process of this one) run before any process
cluster exists.

``distributed.utils_test`` is distributed's test machinery, not public API: it is imported here
only, lazily (so the unit tier does not import it), and test files take it from this module.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

TIERS = ("unit", "cluster", "system")
UNIT_DIR = Path(__file__).parent / "unit"
UNIT_TIMEOUT_S = 30
UNIT_BUDGET_S = 30
# Fixtures and markers that make a test a system test even when it also uses `inproc_client`.
SYSTEM_FIXTURES = frozenset({"client", "cluster", "slurm", "slurm_session", "tmpfs"})
SYSTEM_MARKERS = frozenset({"slow", "hosts", "slurm", "gpu"})
CLUSTER_FIXTURES = frozenset({"inproc_client", "cleanup"})
# What distributed.utils_test re-exports through this module (its names, lazily imported).
_DISTRIBUTED_TESTING = ("gen_cluster", "gen_test")


def __getattr__(name: str):
    """``from conftest import gen_cluster``: distributed's test decorators, imported on use."""
    if name in _DISTRIBUTED_TESTING:
        import distributed.utils_test

        return getattr(distributed.utils_test, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --- tiers -----------------------------------------------------------------------------------

def _is_under(path: Path, directory: Path) -> bool:
    try:
        path.resolve().relative_to(directory.resolve())
    except ValueError:
        return False
    return True


def _wraps_a_coroutine(function) -> bool:
    """True for a test written with ``gen_cluster``/``gen_test``: a plain function that runs a
    coroutine function on its own event loop and names it as ``__wrapped__``."""
    import inspect

    wrapped = getattr(function, "__wrapped__", None)
    return (function is not None and not inspect.iscoroutinefunction(function)
            and wrapped is not None and inspect.iscoroutinefunction(wrapped))


def tier_of(item: pytest.Item) -> str:
    """The tier rule (module docstring); raises a UsageError for a contradictory mark."""
    explicit = [name for name in TIERS if item.get_closest_marker(name) is not None]
    in_unit_dir = _is_under(Path(str(item.path)), UNIT_DIR)
    if in_unit_dir:
        if explicit and explicit != ["unit"]:
            raise pytest.UsageError(f"{item.nodeid} is under tests/unit/ but marked "
                                    f"{explicit}: move it out of tests/unit/ or drop the mark")
        return "unit"
    if "unit" in explicit:
        raise pytest.UsageError(f"{item.nodeid} is marked unit outside tests/unit/: the unit "
                                "tier is the directory; move the test there")
    if len(explicit) > 1:
        raise pytest.UsageError(f"{item.nodeid} has several tier marks {explicit}: keep one")
    if explicit:
        return explicit[0]
    fixtures = set(getattr(item, "fixturenames", ()))
    if fixtures & SYSTEM_FIXTURES or any(item.get_closest_marker(m) for m in SYSTEM_MARKERS):
        return "system"
    if fixtures & CLUSTER_FIXTURES or _wraps_a_coroutine(getattr(item, "function", None)):
        return "cluster"
    return "system"


BED_FILES = {"slurm": "test_slurm.py", "hosts": "test_hosts.py"}
"""The test beds, each with the file its tests live in. In a parallel run each bed's file runs
in one test process, one test after another (one SLURM, one set of namespace hosts at a time):
see :func:`pytest_xdist_make_scheduler`."""


def bed_of(item: pytest.Item) -> str | None:
    """The test bed ``item`` runs on (its marker or fixture), or None."""
    fixtures = set(getattr(item, "fixturenames", ()))
    for bed in BED_FILES:
        if item.get_closest_marker(bed) is not None or bed in fixtures:
            return bed
    return None


def _check_bed_file(item: pytest.Item, bed: str) -> None:
    if Path(str(item.path)).name != BED_FILES[bed]:
        raise pytest.UsageError(f"{item.nodeid} runs on the {bed} test bed but is not in "
                                f"{BED_FILES[bed]}: move it there (a bed's tests run in one "
                                "test process, found by their file)")


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """The parallel run's scheduler: xdist's load-by-scope, with one scope per bed file (its
    tests go to one test process, in order) and one per test elsewhere. Scopes are handed out
    in the collection's order (``--no-loadscope-reorder``), which :func:`run_order` sets."""
    from xdist.scheduler import LoadScopeScheduling

    bed_scopes = {name: f"bed:{bed}" for bed, name in BED_FILES.items()}

    class BedScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return bed_scopes.get(nodeid.split("::", 1)[0].rsplit("/", 1)[-1], nodeid)

    return BedScheduling(config, log)


def run_order(item: pytest.Item) -> tuple[int, int]:
    """Tiers in order (fast feedback first; ``gen_cluster``'s leak checks end every
    multiprocessing child of its process, so in each test process they run before any process
    cluster of a system test exists), and within the system tier the beds' files first: each
    is one long chain in one test process, started while the others share out the rest. The
    sort is stable: file order otherwise."""
    tier = next(TIERS.index(t) for t in TIERS if item.get_closest_marker(t))
    return tier, 0 if Path(str(item.path)).name in BED_FILES.values() else 1


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """``-m unit`` imports only the files of tests/unit/ (the tier is that directory): the
    other test modules import Dask, torch and the test beds, which would cost more than the
    tier itself."""
    if (config.getoption("markexpr") == "unit" and collection_path.suffix == ".py"
            and not _is_under(collection_path, UNIT_DIR)):
        return True
    return None


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    """Marks each test with its tier before ``-m`` selects, and runs the tiers in order once
    every other plugin (``-m``, ``-k``, pytest's grouping by fixture scope) is done."""
    if any("gpu" in item.keywords for item in items):
        import torch

        if not torch.cuda.is_available():
            for item in items:
                if "gpu" in item.keywords:
                    item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
    for item in items:
        tier = tier_of(item)
        item.add_marker(tier)
        if tier == "unit" and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(UNIT_TIMEOUT_S))
        if (bed := bed_of(item)) is not None:
            _check_bed_file(item, bed)
    yield
    items.sort(key=run_order)


# --- the unit tier's guard -------------------------------------------------------------------

class DaskInUnitTestError(RuntimeError):
    """A unit-tier test started a process, opened a network socket or started Dask."""


_guard = {"item": None, "violations": []}
_BLOCKED_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn",
                             "os.spawn", "os.system", "os.exec"})
_NETWORK_FAMILIES = (socket.AF_INET, socket.AF_INET6)


def _violation(what: str) -> DaskInUnitTestError:
    item = _guard["item"]
    message = (f"{item.nodeid} is a unit-tier test (under tests/unit/) but {what}: unit tests "
               "run without processes, network or Dask; move it to tests/ (the cluster or "
               "system tier), or test the pure part without it")
    _guard["violations"].append(message)
    return DaskInUnitTestError(message)


def _audit(event: str, args: tuple) -> None:
    if _guard["item"] is None:
        return
    if event in _BLOCKED_EVENTS:
        raise _violation(f"started a process ({event})")
    if event in ("socket.bind", "socket.connect") and args[0].family in _NETWORK_FAMILIES:
        raise _violation(f"opened a network socket ({event} {args[1]!r})")


sys.addaudithook(_audit)  # audit hooks cannot be removed: inert unless a unit test runs


def _refuse_dask_server(self, *args, **kwargs):
    raise _violation(f"started a Dask server ({type(self).__name__})")


def _guard_on(item: pytest.Item) -> None:
    _guard["item"], _guard["violations"] = item, []
    _guard["had_distributed"] = "distributed" in sys.modules
    if _guard["had_distributed"]:
        import distributed.core

        _guard["patch"] = patch = pytest.MonkeyPatch()
        patch.setattr(distributed.core.Server, "__init__", _refuse_dask_server)


def _guard_off() -> list[str]:
    if patch := _guard.pop("patch", None):
        patch.undo()
    if not _guard["had_distributed"] and "distributed" in sys.modules:
        _violation("imported distributed")
    _guard["item"] = None
    violations, _guard["violations"] = _guard["violations"], []
    return violations


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item):
    if item.get_closest_marker("unit") is not None:
        _guard_on(item)
    try:
        return (yield)
    except BaseException:
        if _guard["item"] is item:
            _guard_off()
        raise


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item):
    if _guard["item"] is not item:
        return (yield)
    try:
        result = yield
    finally:
        violations = _guard_off()
    if violations:
        pytest.fail("\n".join(dict.fromkeys(violations)), pytrace=False)
    return result


def pytest_configure(config):
    """The hang guard (tests/hang_guard.py): a run stuck past a test's timeout ends, saying
    where, instead of stalling CI."""
    import hang_guard

    if not config.pluginmanager.is_registered(hang_guard):
        config.pluginmanager.register(hang_guard, "hang_guard")


_started = pytest.StashKey[float]()

PROCESSES_PER_CORE = 2
"""Test processes per core (``-n auto``): most tests wait on processes of their own (clusters,
daemons, the CLI), so two per core overlap those waits without leaving the cores idle."""
MAX_PROCESSES = 8


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """How many test processes ``-n auto`` (the default, ``pyproject.toml``) starts: the
    environment variable ``DASKRL_TEST_PROCESSES`` if set, else :data:`PROCESSES_PER_CORE`
    per core (at most :data:`MAX_PROCESSES`); the unit tier alone, one per core (it is all
    CPU). ``-n 0`` runs the suite in this process."""
    if given := os.environ.get("DASKRL_TEST_PROCESSES"):
        return int(given)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    per_core = 1 if config.getoption("markexpr") == "unit" else PROCESSES_PER_CORE
    return max(1, min(MAX_PROCESSES, per_core * (cores or 1)))


def pytest_sessionstart(session):
    session.config.stash[_started] = time.monotonic()
    # A suite started as a background job of a non-interactive shell (`cmd &` in a script)
    # inherits SIGINT ignored, and so would every process the tests start: the ctrl-c tests
    # (a killed `daskrl collect`, a SLURM learner) would see their SIGINT dropped. Python's
    # own handler here makes each started program get the default disposition back.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


_OUTCOMES = ("passed", "failed", "skipped", "error", "xfailed", "xpassed")


def pytest_terminal_summary(terminalreporter, config):
    """Says how long a run of the unit tier alone took, against its budget (counted from the
    tests' reports, which come back from the test processes with their markers)."""
    tests: dict[str, bool] = {}
    for outcome in _OUTCOMES:
        for report in terminalreporter.stats.get(outcome, ()):
            if (nodeid := getattr(report, "nodeid", "")) and hasattr(report, "keywords"):
                tests[nodeid] = "unit" in report.keywords
    if not tests or not all(tests.values()):
        return
    took = time.monotonic() - config.stash[_started]
    over = (f": over its {UNIT_BUDGET_S} s budget, find the slow tests with --durations=10"
            if took > UNIT_BUDGET_S else f" (budget {UNIT_BUDGET_S} s)")
    terminalreporter.write_line(f"unit tier: {len(tests)} tests in {took:.1f} s{over}")


# --- fixtures --------------------------------------------------------------------------------

@pytest.fixture
def cleanup():
    """distributed's per-test checks (no leaked threads, processes, clients, comms)."""
    from distributed.utils_test import clean

    with clean():
        yield


CLOSE_TIMEOUT_S = 60
"""How long a fixture's client or cluster may take to close: a close stuck on a worker thread
fails the test's teardown instead of hanging it (it may run after the test's timeout fired)."""


@contextlib.contextmanager
def _closing(cluster_or_client):
    try:
        yield cluster_or_client
    finally:
        cluster_or_client.close(timeout=CLOSE_TIMEOUT_S)


@pytest.fixture(scope="session")
def cluster():
    """Two spawn-started worker processes, one thread each, shared by the test process's
    tests. With the embedded cluster's worker settings (no statistical profiler, slower health
    ticks and monitors): idle for most of the session, each of the suite's parallel test
    processes keeps one, and Dask's defaults cost several percent of a core each."""
    import dask
    from distributed import LocalCluster

    from daskrl.deploy._cluster import WORKER_CONFIG

    with dask.config.set(WORKER_CONFIG):
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                               dashboard_address=None, silence_logs=logging.ERROR)
    with _closing(cluster):
        yield cluster


@pytest.fixture
def client(cluster):
    from distributed import Client

    from daskrl.weights._segments import shared_memory_dir

    with _closing(Client(cluster, set_as_default=False)) as client:
        yield client
        # Each test leaves the shared cluster as it found it, and no weights in shared memory.
        assert not client.list_datasets(), client.list_datasets()
        assert not glob.glob(os.path.join(shared_memory_dir(), f"daskrl-weights-{os.getpid()}-*"))


@pytest.fixture
def inproc_client():
    """An in-process cluster (processes=False): workers share this process's memory."""
    from distributed import Client, LocalCluster

    with (
        _closing(LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                              dashboard_address=None, silence_logs=logging.ERROR)) as cluster,
        _closing(Client(cluster, set_as_default=False)) as client,
    ):
        yield client


@pytest.fixture
def cartpole_policy():
    import gymnasium as gym

    from daskrl.policies import MLPPolicy

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
