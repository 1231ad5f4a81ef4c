"""The learner/worker version check's table, from the versions Dask reports (no cluster: the
real call on one is in tests/test_versions.py)."""

from __future__ import annotations

from daskrl.deploy._package_versions import version_differences, version_table


def _versions(**workers: dict[str, str | None]) -> dict:
    mine = {"daskrl": "0.1.0", "torch": "2.13.0+cpu", "gymnasium": "1.4.0", "zarr": "3.1.6",
            "numpy": "2.4.6", "distributed": "2026.8.0", "cloudpickle": "3.1.3"}
    return {
        "client": {"host": {}, "packages": mine},
        "scheduler": {"host": {}, "packages": {"distributed": "2026.8.0"}},
        "workers": {addr: {"host": {}, "packages": {**mine, **diff}}
                    for addr, diff in workers.items()},
    }


def test_table_lists_only_differing_packages_and_workers():
    versions = _versions(**{
        "tcp://10.0.0.1:4000": {},
        "tcp://10.0.0.2:4000": {"torch": "2.5.1+cu121", "zarr": None},
        "tcp://10.0.0.3:4000": {"gymnasium": "0.29.1"},
    })
    assert version_differences(versions) == {
        "tcp://10.0.0.2:4000": {"torch": "2.5.1+cu121", "zarr": "not installed"},
        "tcp://10.0.0.3:4000": {"gymnasium": "0.29.1"},
    }
    assert version_table(versions) == (
        "package    learner     tcp://10.0.0.2:4000  tcp://10.0.0.3:4000\n"
        "---------  ----------  -------------------  -------------------\n"
        "torch      2.13.0+cpu  2.5.1+cu121          (same)\n"
        "gymnasium  1.4.0       (same)               0.29.1\n"
        "zarr       3.1.6       not installed        (same)"
    )


def test_no_table_when_everything_matches():
    versions = _versions(**{"tcp://10.0.0.1:4000": {}, "tcp://10.0.0.2:4000": {}})
    assert version_differences(versions) == {}
    assert version_table(versions) == ""
