"""The async collection's settings, checked on the learner before any cluster starts. (Async
collection, policy lag, backpressure and the futures API on a real LocalCluster:
tests/test_async_and_futures.py.)"""

from __future__ import annotations

import re

import pytest

# The Collector's module imports distributed: here, at collection (the unit tier refuses a
# test that imports it first); no test here gets as far as starting a cluster.
from daskrl import Collector, ConfigError
from daskrl.testing import TagPolicy

COUNTING = "daskrl.testing:Counting-v0"


def test_max_policy_lag_is_validated(tmp_path):
    with pytest.raises(ConfigError, match=re.escape(
            "max_policy_lag must be an integer >= 0 or None, got -1.")):
        Collector(COUNTING, TagPolicy(), str(tmp_path / "s"), max_policy_lag=-1)
