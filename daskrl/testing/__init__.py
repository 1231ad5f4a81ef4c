"""Small, deterministic envs and policies for testing daskrl and code built on it.

They are importable on workers (a package module, not a test file), so they work with
spawn-started Dask workers.
"""

from __future__ import annotations

from daskrl.testing._continuity import ContinuityReport, check_episode_continuity
from daskrl.testing._envs import CountingEnv, EnvVarEnv, InfoCountingEnv, SlowEnv, recorded_cartpole
from daskrl.testing._faulty_env import FaultyEnv
from daskrl.testing._policies import (
    ConstantPolicy,
    EnvVarPolicy,
    NoisePolicy,
    SpacePolicy,
    TagPolicy,
)
from daskrl.testing._recurrent import GRUPolicy, StepCountPolicy
from daskrl.testing._structured_envs import GoalCountingEnv, TupleCountingEnv
from daskrl.testing._vector_env import CountingVectorEnv
from daskrl.testing._weights import worker_weights

__all__ = [
    "ConstantPolicy",
    "ContinuityReport",
    "CountingEnv",
    "CountingVectorEnv",
    "EnvVarEnv",
    "EnvVarPolicy",
    "FaultyEnv",
    "GRUPolicy",
    "GoalCountingEnv",
    "InfoCountingEnv",
    "NoisePolicy",
    "SlowEnv",
    "SpacePolicy",
    "StepCountPolicy",
    "TagPolicy",
    "TupleCountingEnv",
    "check_episode_continuity",
    "recorded_cartpole",
    "worker_weights",
]

# Public under the package's name (in reprs, error messages and pickles), not a private
# module's: where a class lives inside the package is not part of its name.
for _name in __all__:
    globals()[_name].__module__ = __name__
