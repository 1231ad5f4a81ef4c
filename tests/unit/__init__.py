"""The unit tier: tests with no Dask, no processes and no network (tests/conftest.py marks and
guards them). A package so that a unit test may share its basename with a test in tests/
(``tests/unit/test_rollout.py`` next to ``tests/test_rollout.py``): pytest imports it as
``unit.test_rollout``."""
