"""Rollouts of envs with Dict and Tuple observation and action spaces, without Dask: one array
per leaf, every transition real, actions reaching the env as dicts and tuples (clipped), and
clear errors for spaces, observations and policy outputs that do not fit."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from daskrl import ConfigError, EnvError, PolicyError
from daskrl.collect._checks import check_policy_output
from daskrl.policies import MLPPolicy
from daskrl.testing import GoalCountingEnv, SpacePolicy, TagPolicy, TupleCountingEnv
from daskrl.worker._envs import EnvSpec
from daskrl.worker._rollout import EnvSet
from daskrl.worker._spaces import SpaceLayout

CPU = torch.device("cpu")


def _collect(make, policy=None, steps=9, batches=2, random_steps=0, n_envs=3):
    envset = EnvSet(EnvSpec(make), n_envs=n_envs, seed=0, stream=0)
    policy = policy or SpacePolicy(envset.act_space)
    outs = [envset.collect(policy, CPU, steps=steps, batch_id=b, random_steps=random_steps)[0]
            for b in range(batches)]
    return {k: np.concatenate([o[k] for o in outs]) for k in outs[0]}


def test_dict_observations_and_actions_are_real_transitions_leaf_by_leaf():
    data = _collect(lambda: GoalCountingEnv(4, dict_actions=True))
    obs_keys = ["achieved_goal", "desired_goal", "last_force", "observation", "phase"]
    assert sorted(k for k in data if k.startswith("observation/")) == [
        f"observation/{k}" for k in obs_keys]
    assert data["observation/phase"].dtype == np.int64  # Discrete entry
    assert data["action/step"].dtype == np.int64 and data["action/force"].dtype == np.float32
    o, n = "observation/observation", "next_observation/observation"
    assert np.array_equal(data[n], data[o] + [0, 1])  # no autoreset junk transition
    assert np.array_equal(data["next_observation/achieved_goal"][..., 0], data[n][..., 1])
    assert (data["observation/desired_goal"] == 4).all()
    assert np.array_equal(data["next_observation/phase"], data[n][..., 1])
    assert np.array_equal(data["terminated"], data[n][..., 1] == 4)  # the true final one
    assert np.array_equal(data["step"], data[o][..., 1])
    # The env received each stored action clipped to the Box bounds (SpacePolicy samples
    # outside them), and reports it as next_observation["last_force"].
    force = data["action/force"]
    assert (np.abs(force) > 1).any()
    assert np.array_equal(data["next_observation/last_force"], np.clip(force, -1, 1))


def test_tuple_spaces_and_random_steps():
    data = _collect(lambda: TupleCountingEnv(3), random_steps=4)
    assert sorted(k for k in data if k.startswith("observation/")) == [
        "observation/0", "observation/1", "observation/2"]
    assert data["observation/2"].dtype == np.int8
    assert np.array_equal(data["next_observation/0"], data["observation/0"] + [0, 1])
    t = data["next_observation/0"][..., 1].astype(int)
    assert np.array_equal(data["next_observation/1"], t)
    assert np.array_equal(data["next_observation/2"], np.stack([(t >> b) & 1 for b in range(3)], -1))
    # random steps: samples of the Tuple action space, stored in the policy's dtypes
    assert data["action/0"].dtype == np.int64 and data["action/1"].dtype == np.float32
    assert set(np.unique(data["action/0"][:4]).tolist()) <= {0, 1}
    assert (np.abs(data["action/1"][:4]) <= 1).all()


def test_mlp_policy_flattens_dict_observations_by_key():
    env = GoalCountingEnv(4)
    policy = MLPPolicy(env.observation_space, env.action_space)
    data = _collect(lambda: GoalCountingEnv(4), policy)
    assert data["action"].dtype == np.int64 and data["log_prob"].shape == data["action"].shape
    # the same input whatever the order of the dict's keys (a loaded batch's are sorted)
    obs = SpaceLayout(env.observation_space).join([
        torch.as_tensor(np.stack([env.observation_space.sample()[leaf.path] for _ in range(5)]))
        for leaf in SpaceLayout(env.observation_space).leaves])
    reordered = dict(reversed(list(obs.items())))
    torch.manual_seed(0)
    a = policy(obs)["log_prob"]
    torch.manual_seed(0)
    assert torch.equal(a, policy(reordered)["log_prob"])
    with pytest.raises(ConfigError, match=r"MLPPolicy cannot flatten this space.*Text"):
        MLPPolicy(spaces.Dict({"mission": spaces.Text(5)}), env.action_space)


class _SpaceEnv(gym.Env):
    def __init__(self, observation_space, action_space=None, bad_obs=None):
        self.observation_space = observation_space
        self.action_space = action_space or spaces.Discrete(2)
        self.bad_obs = bad_obs
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(0)
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        obs = self.observation_space.sample()
        if self.bad_obs is not None and self.t >= 2:
            obs = self.bad_obs(obs)
        return obs, 1.0, False, False, {}


@pytest.mark.parametrize("space, problem", [
    (spaces.Dict({"mission": spaces.Text(5)}), "has at 'mission' the space Text"),
    (spaces.Dict({"my-key": spaces.Discrete(2)}), "has the key 'my-key' at its top, which is not "
                                                  "a Python identifier"),
    (spaces.Dict({"a": spaces.Tuple(())}), "has at 'a' the space Tuple(), which is empty"),
    (spaces.Sequence(spaces.Discrete(2)), "is Sequence"),
    (spaces.Graph(spaces.Box(0, 1, (2,)), None), "is Graph"),
])
def test_unsupported_structured_spaces_are_refused_on_the_learner(space, problem):
    spec = EnvSpec(lambda: _SpaceEnv(space))
    with pytest.raises(ConfigError, match=re.escape(problem)) as e:
        spec.probe()
    assert "Dict and Tuple spaces of them" in str(e.value)


def test_supported_nested_space_probes():
    space = spaces.Dict({"a": spaces.Tuple((spaces.Box(0, 1, (2,)), spaces.Dict(
        {"b": spaces.MultiDiscrete([2, 3]), "c": spaces.MultiBinary(2)})))})
    spec = EnvSpec(lambda: _SpaceEnv(space))
    assert spec.probe()[0] == space
    data = _collect(lambda: _SpaceEnv(space), TagPolicy(), steps=3, batches=1, n_envs=2)
    assert {"observation/a/0", "observation/a/1/b", "observation/a/1/c"} <= set(data)


@pytest.mark.parametrize("bad, problem", [
    (lambda o: {k: v for k, v in o.items() if k != "phase"},
     "an observation that is a mapping with keys ['achieved_goal', 'desired_goal', "
     "'observation'] where its space wants a dict with keys"),
    (lambda o: {**o, "desired_goal": np.zeros(3, np.float32)},
     "an observation whose observation['desired_goal'] has shape (3,) and dtype float32"),
    (lambda o: np.zeros(2, np.float32), "an observation that is a ndarray where its space"),
])
def test_observations_that_do_not_fit_name_env_index_and_leaf(bad, problem):
    space = GoalCountingEnv().observation_space
    spec = EnvSpec(lambda: _SpaceEnv(space, bad_obs=bad))
    envset = EnvSet(spec, n_envs=2, seed=0, stream=0)
    with pytest.raises(EnvError, match=re.escape(problem)) as e:
        envset.collect(TagPolicy(), CPU, steps=3, batch_id=7)
    assert "(env index 0)" in str(e.value) and "step 1 of batch 7" in str(e.value)


def test_non_finite_leaf_is_named():
    space = spaces.Dict({"x": spaces.Box(-np.inf, np.inf, (2,), np.float32)})
    spec = EnvSpec(lambda: _SpaceEnv(space, bad_obs=lambda o: {"x": np.array([0, np.nan],
                                                                              np.float32)}))
    with pytest.raises(EnvError, match=re.escape("returned a non-finite observation['x']")):
        EnvSet(spec, n_envs=2, seed=0, stream=0).collect(TagPolicy(), CPU, steps=3, batch_id=0)


class _FixedAction(torch.nn.Module):
    def __init__(self, action):
        super().__init__()
        self.action = action

    def forward(self, obs):
        return {"action": self.action}


@pytest.mark.parametrize("action, problem", [
    (torch.zeros(2, dtype=torch.int64), "policy output 'action' is a Tensor where its space "
                                        "wants a dict with keys ['force', 'step']"),
    ({"step": torch.zeros(2, dtype=torch.int64)}, "a mapping with keys ['step'] where"),
    ({"step": torch.zeros(2, dtype=torch.int64), "force": torch.zeros(2, 3)},
     "policy output \"action['force']\" has shape (2, 3)"),
    ({"step": torch.zeros(2), "force": torch.zeros(2, 2)},
     "policy output \"action['step']\" has dtype torch.float32"),
    ({"step": torch.zeros(2, dtype=torch.int64), "force": [1, 2]},
     "policy output 'action' is {'step': tensor (2,) torch.int64 on cpu, 'force': a list}"),
])
def test_structured_actions_that_do_not_fit_are_refused(action, problem):
    env = GoalCountingEnv(dict_actions=True)
    spec = EnvSpec(lambda: GoalCountingEnv(dict_actions=True))
    with pytest.raises(PolicyError, match=re.escape(problem)):
        check_policy_output(_FixedAction(action), spec, env.observation_space,
                            env.action_space, 2)
    with pytest.raises(PolicyError, match=re.escape(problem)):
        EnvSet(spec, n_envs=2, seed=0, stream=0).collect(_FixedAction(action), CPU, 2, 0)


def test_policy_that_raises_on_dict_observations_describes_them():
    class Raises(torch.nn.Module):
        def forward(self, obs):
            raise KeyError("goal")

    env = GoalCountingEnv()
    spec = EnvSpec(GoalCountingEnv)
    with pytest.raises(PolicyError, match=re.escape(
            "({'achieved_goal': tensor (2, 1) torch.float32 on cpu, 'desired_goal'")):
        check_policy_output(Raises(), spec, env.observation_space, env.action_space, 2)
    with pytest.raises(PolicyError, match=re.escape("'phase': tensor (2,) torch.int64 on cpu")):
        EnvSet(spec, n_envs=2, seed=0, stream=0).collect(Raises(), CPU, 2, 0)


class _BareTuple(torch.nn.Module):
    """SpacePolicy's actions of a Tuple action space, returned as a bare tuple."""

    def __init__(self, action_space: gym.Space) -> None:
        super().__init__()
        self.inner = SpacePolicy(action_space)

    def forward(self, obs):
        return self.inner(obs)["action"]


def test_a_bare_tuple_is_the_action_of_a_tuple_space():
    """As gymnasium's vector envs take it: the same batch as ``{"action": (...)}``."""
    env = TupleCountingEnv(3)
    check_policy_output(_BareTuple(env.action_space), EnvSpec(TupleCountingEnv),
                        env.observation_space, env.action_space, 2)
    torch.manual_seed(0)
    bare = _collect(lambda: TupleCountingEnv(3), _BareTuple(env.action_space))
    torch.manual_seed(0)
    wrapped = _collect(lambda: TupleCountingEnv(3), SpacePolicy(env.action_space))
    assert sorted(bare) == sorted(wrapped)
    for key in wrapped:
        assert np.array_equal(bare[key], wrapped[key]), key
    assert bare["action/0"].dtype == np.int64 and bare["action/1"].shape == (18, 3, 1)


def test_a_bare_tuple_for_another_action_space_is_refused():
    class Pair(torch.nn.Module):
        def forward(self, obs):
            return torch.zeros(obs.shape[0], dtype=torch.int64), torch.zeros(obs.shape[0])

    env = gym.make("CartPole-v1")
    spec = EnvSpec("CartPole-v1")
    problem = ("policy output 'action' is a tuple (tensor (2,) torch.int64 on cpu, tensor "
               "(2,) torch.float32 on cpu): a tuple is the action of a Tuple action space, but "
               "env 'CartPole-v1' has the action space Discrete(2). Return the action as a "
               "tensor, and any extra outputs in a dict {'action': ..., 'log_prob': ...}.")
    with pytest.raises(PolicyError, match=re.escape(problem)):
        check_policy_output(Pair(), spec, env.observation_space, env.action_space, 2)
    with pytest.raises(PolicyError, match=re.escape(problem)):
        EnvSet(spec, n_envs=2, seed=0, stream=0).collect(Pair(), CPU, 2, 0)
