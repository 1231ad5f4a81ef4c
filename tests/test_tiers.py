"""The test tiers of tests/conftest.py, on a small suite of their own run by a real pytest."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).with_name("conftest.py")
UNIT = '''
import socket
import subprocess


def test_pure():
    assert sum([1, 2]) == 3


def test_starts_a_process():
    subprocess.run(["true"], check=True)


def test_swallows_the_refusal():
    try:
        subprocess.run(["true"], check=True)
    except Exception:
        pass


def test_binds_a_socket():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
'''
OTHERS = '''
import pytest
from conftest import gen_cluster


@gen_cluster(client=True)
async def test_in_process_cluster(c, s, a, b):
    assert await c.submit(sum, [1, 2]) == 3


def test_fixture(inproc_client):
    pass


def test_everything_else():
    pass


@pytest.mark.system
def test_named(inproc_client):
    pass
'''


@pytest.fixture
def suite(pytester):
    shutil.copy(CONFTEST, pytester.path / "conftest.py")
    shutil.copy(CONFTEST.parent / "hang_guard.py", pytester.path / "hang_guard.py")  # it loads
    shutil.copy(CONFTEST.parent.parent / "pyproject.toml", pytester.path / "pyproject.toml")
    (pytester.path / "unit").mkdir()
    (pytester.path / "unit" / "__init__.py").write_text("")
    (pytester.path / "unit" / "test_a.py").write_text(UNIT)
    (pytester.path / "test_a.py").write_text(OTHERS)  # the same basename as the unit file
    return pytester


@pytest.mark.timeout(120)
def test_each_test_has_one_tier_and_tiers_run_in_order(suite):
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", "-o", "testpaths=.", "-v",
                                        "-n", "0")
    result.assert_outcomes(passed=5, failed=3)
    order = [line.split(" ")[0] for line in result.outlines if " PASSED" in line
             or " FAILED" in line]
    assert [name.split("::")[0] for name in order] == ["unit/test_a.py"] * 4 + ["test_a.py"] * 4
    # the cluster tier (gen_cluster, the inproc_client fixture) runs before the system tier
    assert order[4:6] == ["test_a.py::test_in_process_cluster", "test_a.py::test_fixture"]


@pytest.mark.timeout(120)
def test_a_unit_test_that_starts_a_process_or_opens_a_socket_fails(suite):
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", "-o", "testpaths=.",
                                        "-m", "unit", "-n", "2")
    result.assert_outcomes(passed=1, failed=3)
    for line in ("*test_starts_a_process*started a process (subprocess.Popen)*",  # any order:
                 "*test_swallows_the_refusal*started a process (subprocess.Popen)*",  # two
                 "*test_binds_a_socket*opened a network socket (socket.bind*"):  # processes
        result.stdout.fnmatch_lines([line])
    result.stdout.fnmatch_lines(["unit tier: 4 tests in *"])


BEDS = '''
import pytest


@pytest.mark.BED
@pytest.mark.parametrize("i", range(4))
def test_on_BED(i):
    pass


@pytest.mark.parametrize("i", range(4))
def test_beside_BED(i):
    pass
'''
ELSEWHERE = '''
import pytest


@pytest.mark.parametrize("i", range(8))
def test_elsewhere(i):
    pass
'''


@pytest.mark.timeout(120)
def test_in_parallel_each_bed_runs_in_one_process_and_each_process_keeps_the_tier_order(suite):
    for bed in ("hosts", "slurm"):
        (suite.path / f"test_{bed}.py").write_text(BEDS.replace("BED", bed))
    (suite.path / "test_b.py").write_text(ELSEWHERE)
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", "-o", "testpaths=.", "-v",
                                        "-n", "3")
    result.assert_outcomes(passed=5 + 24, failed=3)
    ran: dict[str, list[str]] = {}  # test process -> its tests, in the order they ran
    for line in result.outlines:
        if line.startswith("[gw") and (" PASSED " in line or " FAILED " in line):
            ran.setdefault(line.split("]")[0], []).append(line.split()[-1])
    assert sum(len(tests) for tests in ran.values()) == 32
    for bed in ("test_hosts.py", "test_slurm.py"):  # each bed's file in one test process
        assert len([p for p, tests in ran.items() if any(bed in t for t in tests)]) == 1, ran
    tier = {"unit/": 0, "test_a.py::test_in_process_cluster": 1, "test_a.py::test_fixture": 1}
    for tests in ran.values():
        order = [next((v for k, v in tier.items() if t.startswith(k)), 2) for t in tests]
        assert order == sorted(order), tests


@pytest.mark.timeout(120)
def test_a_bed_test_outside_its_file_is_refused(suite):
    (suite.path / "test_b.py").write_text(BEDS.replace("BED", "slurm"))
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", "-o", "testpaths=.", "-n", "0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_b.py::test_on_slurm*runs on the slurm test bed but "
                                 "is not in test_slurm.py: move it there*"])
