"""The learner/worker version check: the real call on a cluster. (The table users see:
tests/unit/test_versions.py.)"""

from __future__ import annotations

from daskrl.deploy._package_versions import (
    CHECKED_PACKAGES,
    check_versions,
    version_differences,
    version_table,
)


def test_real_versions_on_a_local_cluster_match(client):
    versions = client.get_versions(packages=list(CHECKED_PACKAGES))
    assert len(versions["workers"]) == 2
    assert version_differences(versions) == {}
    check_versions(client)  # does not raise
    # And the learner's side really is what is installed here.
    assert versions["client"]["packages"]["daskrl"] is not None


def test_a_learner_side_difference_names_every_worker(client):
    # A package no process has is "not installed" everywhere: equal, so no error.
    check_versions(client, packages=("daskrl-no-such-package",))
    versions = client.get_versions(packages=["numpy"])
    versions["client"]["packages"]["numpy"] = "0.0.1"  # as if the learner had another numpy
    assert sorted(version_differences(versions, ["numpy"])) == sorted(versions["workers"])
    table = version_table(versions, ["numpy"]).splitlines()
    assert table[0].split() == ["package", "learner", *sorted(versions["workers"])]
    assert table[2].split()[:2] == ["numpy", "0.0.1"]
