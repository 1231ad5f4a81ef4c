"""Wrapper specs and env import paths, without Dask: the grammar, its errors, and real gymnasium
wrappers applied in order by ``EnvSpec.make`` (what workers and the learner's probe run)."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest

from daskrl import ConfigError, EnvError, WrapperError
from daskrl._settings import WrapperSpec, parse_wrapper, parse_wrappers
from daskrl.config import CollectorConfig
from daskrl.testing import CountingEnv
from daskrl.worker._envs import EnvSpec

FRAME_STACK = "gymnasium.wrappers.FrameStackObservation"


def _spec(env, *wrappers, **kw):
    return EnvSpec(env, wrappers=parse_wrappers(list(wrappers)), **kw)


def _episode_length(env: gym.Env, limit: int = 100) -> tuple[int, bool, bool]:
    env.reset(seed=0)
    for t in range(1, limit + 1):
        _, _, terminated, truncated, _ = env.step(0)
        if terminated or truncated:
            return t, terminated, truncated
    raise AssertionError("no episode end")


def test_the_grammar_gives_path_and_literal_kwargs_in_canonical_form():
    w = parse_wrapper(f" {FRAME_STACK} : stack_size = 4 ")
    assert w == WrapperSpec(FRAME_STACK, {"stack_size": 4})
    assert w.text == f"{FRAME_STACK}:stack_size=4"
    w = parse_wrapper("gymnasium.wrappers.AtariPreprocessing:frame_skip=1,screen_size=(84, 84),"
                      "grayscale_obs=True,noop_max=0,terminal_on_life_loss=False")
    assert w.kwargs == {"frame_skip": 1, "screen_size": (84, 84), "grayscale_obs": True,
                        "noop_max": 0, "terminal_on_life_loss": False}
    assert parse_wrapper(w.text) == w  # the canonical form parses back to the same spec
    assert parse_wrapper("a.b:mode='rgb',xs=[1, 2],d={'k': None},x=-0.5").kwargs == {
        "mode": "rgb", "xs": [1, 2], "d": {"k": None}, "x": -0.5}
    assert parse_wrapper("gymnasium.wrappers.RecordEpisodeStatistics").kwargs == {}


@pytest.mark.parametrize(("spec", "message"), [
    ("TimeLimit", "wrapper spec 'TimeLimit': 'TimeLimit' is not a dotted import path of a "
                  "wrapper; a wrapper spec is 'package.module.Wrapper'"),
    ("gym.wrappers.1bad", "'gym.wrappers.1bad' is not a dotted import path"),
    ("a.b:4", "wrapper spec 'a.b:4': '4' is not KEY=VALUE pairs separated by commas"),
    ("a.b:k=1)(j=2", "'k=1)(j=2' is not KEY=VALUE pairs"),
    ("a.b:**d", "'**d' is not KEY=VALUE pairs"),
    ("a.b:k=(1,", "'k=(1,' is not KEY=VALUE pairs"),
    ("a.b:", "wrapper spec 'a.b:' has nothing after ':'"),
    ("a.b:k=1,k=2", "wrapper spec 'a.b:k=1,k=2' gives 'k' twice."),
    ("a.b:mode=rgb", "wrapper spec 'a.b:mode=rgb': the value of 'mode' ('rgb') is not a Python "
                     "literal; quote text (mode='...')."),
    ("a.b:f=print('x')", "the value of 'f' (\"print('x')\") is not a Python literal"),
    ("a.b:f=__import__('os')", "is not a Python literal"),
])
def test_bad_specs_are_clear_errors(spec, message):
    with pytest.raises(WrapperError, match=re.escape(message)):
        parse_wrapper(spec)
    with pytest.raises(ConfigError, match=re.escape(message)):  # raised by the config too
        CollectorConfig(wrappers=[spec])


def test_the_config_stores_canonical_specs_and_a_wrapper_is_a_config_error():
    cfg = CollectorConfig(wrappers=[f"{FRAME_STACK}: stack_size=3",
                                    "gymnasium.wrappers.RecordEpisodeStatistics"])
    assert cfg.wrappers == (f"{FRAME_STACK}:stack_size=3",
                            "gymnasium.wrappers.RecordEpisodeStatistics")
    assert cfg.as_dict()["wrappers"] == list(cfg.wrappers)  # plain JSON in the run record
    assert CollectorConfig(wrappers=FRAME_STACK + ":stack_size=2").wrappers == (
        FRAME_STACK + ":stack_size=2",)  # one string is one spec, not its characters
    assert CollectorConfig().as_dict()["wrappers"] == []
    assert issubclass(WrapperError, ConfigError) and issubclass(WrapperError, ValueError)
    with pytest.raises(WrapperError, match="a wrapper must be given as a spec string, got "
                                           "type: "):
        CollectorConfig(wrappers=[gym.wrappers.TimeLimit])
    with pytest.raises(WrapperError, match="wrappers must be a list of wrapper specs, got int"):
        CollectorConfig(wrappers=3)


def test_wrappers_apply_in_order_inside_daskrls_episode_limit():
    env = _spec(CountingEnv, f"{FRAME_STACK}:stack_size=2", f"{FRAME_STACK}:stack_size=3").make()
    assert env.observation_space.shape == (3, 2, 2)  # the first given is innermost
    env = _spec(CountingEnv, f"{FRAME_STACK}:stack_size=3", f"{FRAME_STACK}:stack_size=2").make()
    assert env.observation_space.shape == (2, 3, 2)
    obs, _ = env.reset(seed=0)
    obs, *_ = env.step(0)
    np.testing.assert_array_equal(obs[-1, -1], [0, 1])  # the unwrapped env's observation
    np.testing.assert_array_equal(obs[-1, :2], [[0, 0], [0, 0]])
    # TimeLimit truncates a longer episode; daskrl's max_frames_per_traj stays outermost.
    limit = "gymnasium.wrappers.TimeLimit:max_episode_steps=7"
    assert _episode_length(_spec("daskrl.testing:Counting-v0", limit,
                                 env_kwargs={"length": 10}).make()) == (7, False, True)
    assert _episode_length(_spec("daskrl.testing:Counting-v0", limit, env_kwargs={"length": 10},
                                 max_episode_steps=4).make()) == (4, False, True)
    assert _episode_length(_spec(CountingEnv, limit).make()) == (5, True, False)
    spaces = _spec("CartPole-v1", "gymnasium.wrappers.RecordEpisodeStatistics").probe()
    assert spaces == (gym.make("CartPole-v1").observation_space, gym.spaces.Discrete(2))


@pytest.mark.parametrize(("spec", "message"), [
    ("gymnasium.wrappers.NoSuchWrapper", "wrapper 'gymnasium.wrappers.NoSuchWrapper': "
                                         "'gymnasium.wrappers' has no attribute 'NoSuchWrapper'"),
    ("no_such_package.wrappers.Wrap", "wrapper 'no_such_package.wrappers.Wrap': no module of "
                                      "'no_such_package.wrappers.Wrap' can be imported"),
    ("gymnasium.wrappers.TimeLimit", "wrapper 'gymnasium.wrappers.TimeLimit' failed on env "
                                     "'CartPole-v1': TypeError: "),
    (f"{FRAME_STACK}:stack_size=0", f"wrapper '{FRAME_STACK}:stack_size=0' failed on env "
                                    "'CartPole-v1'"),
    (f"{FRAME_STACK}:size=3", f"wrapper '{FRAME_STACK}:size=3' failed on env 'CartPole-v1': "
                              "TypeError: "),
    ("gymnasium.__version__", "wrapper 'gymnasium.__version__' names a str, not a callable"),
    ("numpy.asarray", "wrapper 'numpy.asarray' returned a ndarray for env 'CartPole-v1', "
                      "expected a gymnasium.Env"),
])
def test_a_wrapper_that_cannot_be_imported_or_applied_fails_the_probe(spec, message):
    with pytest.raises(WrapperError, match=re.escape(message)):
        _spec("CartPole-v1", spec).probe()


def test_env_import_paths_name_ids_or_factories():
    # "module:Id": gymnasium imports the module, which registers the id
    assert _episode_length(EnvSpec("daskrl.testing:Counting-v0").make()) == (5, True, False)
    # "module:factory": a zero-argument callable of the module (here a class)
    env = EnvSpec("daskrl.testing:CountingEnv").make()
    assert type(env.unwrapped) is CountingEnv and _episode_length(env) == (5, True, False)
    # ...called with env_kwargs, if any
    assert _episode_length(EnvSpec("daskrl.testing:CountingEnv", {"length": 3}).make()) == (
        3, True, False)
    assert EnvSpec("daskrl.testing:CountingEnv").label == "daskrl.testing:CountingEnv"
    with pytest.raises(EnvError, match=re.escape(
            "env 'no_such_module_x:make': cannot import 'no_such_module_x': "
            "ModuleNotFoundError: No module named 'no_such_module_x'.")):
        EnvSpec("no_such_module_x:make").make()
    with pytest.raises(EnvError, match=re.escape(
            "env 'daskrl.testing:__all__': daskrl.testing.__all__ is a list, neither a "
            "registered gymnasium id nor a callable making the env.")):
        EnvSpec("daskrl.testing:__all__").make()
    with pytest.raises(EnvError, match=re.escape(
            "could not make env 'daskrl.testing:NoSuchEnv-v0'")) as info:
        EnvSpec("daskrl.testing:NoSuchEnv-v0").make()
    assert "or name a callable making the env ('module:factory')" in str(info.value)
    with pytest.raises(EnvError, match="with one ':'"):
        EnvSpec("a:b:c").make()
