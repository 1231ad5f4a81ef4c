"""Rollouts on real gymnasium envs, without Dask: only real transitions are stored."""

from __future__ import annotations

import functools
import re

import gymnasium as gym
import numpy as np
import pytest
import torch

from daskrl import ConfigError, EnvError, PolicyError
from daskrl.policies import MLPPolicy
from daskrl.testing import ConstantPolicy, CountingEnv, TagPolicy
from daskrl.worker._envs import EnvSpec
from daskrl.worker._rollout import EPISODE_ID_STRIDE, EnvSet

CPU = torch.device("cpu")


def _counting(length: int = 5, max_steps: int | None = None) -> EnvSpec:
    return EnvSpec(lambda: CountingEnv(length), max_episode_steps=max_steps)


def test_every_stored_transition_is_real_across_batches():
    envset = EnvSet(_counting(5), n_envs=3, seed=0, stream=0)
    batches = [envset.collect(TagPolicy(), CPU, steps=7, batch_id=b)[0] for b in range(3)]
    data = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    # next_observation is always the successor of observation: no autoreset junk step.
    assert np.array_equal(data["next_observation"], data["observation"] + [0, 1])
    # Episodes run 5 steps, continue across batch boundaries, and end with terminated=True.
    assert np.array_equal(data["terminated"], data["next_observation"][..., 1] == 5)
    assert not data["truncated"].any()
    assert np.array_equal(data["step"], data["observation"][..., 1])
    # The observation after an end is the reset one, of the next episode.
    ends = np.argwhere(data["terminated"][:-1])
    for t, e in ends:
        assert data["observation"][t + 1, e].tolist() == [data["observation"][t, e, 0] + 1, 0]
    assert np.array_equal(data["reward"], data["next_observation"][..., 1])


def test_episode_ids_are_unique_and_constant_within_episodes():
    envset = EnvSet(_counting(4), n_envs=2, seed=0, stream=0)
    arrays = [envset.collect(TagPolicy(), CPU, steps=6, batch_id=b)[0] for b in (10, 11)]
    ids = np.concatenate([a["episode_id"] for a in arrays])
    episode = np.concatenate([a["observation"][..., 0] for a in arrays])
    for e in range(2):
        # one id per (env, episode number) pair, and distinct between envs
        pairs = set(zip(ids[:, e].tolist(), episode[:, e].tolist()))
        assert len(pairs) == len({p[0] for p in pairs}) == len({p[1] for p in pairs})
    assert len(set(ids[:, 0].tolist()) & set(ids[:, 1].tolist())) == 0
    assert ids.min() >= 10 * EPISODE_ID_STRIDE


def test_episode_ids_steps_and_lengths_follow_where_each_episode_started():
    # Episodes of 2, 3 and 4 steps over batches of 4 rows: they end mid-batch, on a batch's
    # last row (the next one starts with the next batch) and run on across batch boundaries.
    lengths = iter([2, 3, 4])
    E = 3
    envset = EnvSet(EnvSpec(lambda: CountingEnv(next(lengths))), n_envs=E, seed=0, stream=0)
    last_ids = None
    for b in (5, 6, 7):
        arrays, stats = envset.collect(TagPolicy(), CPU, steps=4, batch_id=b)
        ids, step, obs = arrays["episode_id"], arrays["step"], arrays["observation"]
        assert np.array_equal(step, obs[..., 1])  # the env's own step count
        for t, i in np.argwhere(step == 0):  # id: of the batch and row of the reset
            reset_at = (b, t) if t or b == 5 else (b - 1, 4)  # (after the previous batch's end)
            assert ids[t, i] == reset_at[0] * EPISODE_ID_STRIDE + reset_at[1] * E + i
        for t, i in np.argwhere(step > 0):  # an episode keeps its id, across batches too
            before = ids[t - 1, i] if t else last_ids[i]
            assert ids[t, i] == before
        last_ids = ids[-1]
        ends = np.argwhere(arrays["terminated"])  # in order: by row, then env
        assert list(stats["episode_lengths"]) == [step[t, i] + 1 for t, i in ends]
        assert list(stats["episode_returns"]) == [
            float(sum(range(1, step[t, i] + 2))) for t, i in ends]


def test_episode_stats_and_max_frames_per_traj_truncates():
    envset = EnvSet(_counting(100, max_steps=3), n_envs=2, seed=0, stream=0)
    arrays, stats = envset.collect(TagPolicy(), CPU, steps=7, batch_id=0)
    assert arrays["truncated"].sum() == 4 and not arrays["terminated"].any()
    assert np.array_equal(arrays["truncated"], arrays["step"] == 2)
    assert stats["episode_lengths"] == (3, 3, 3, 3)
    assert stats["episode_returns"] == (6.0, 6.0, 6.0, 6.0)


def test_reset_at_each_iter_starts_new_episodes():
    envset = EnvSet(_counting(100), n_envs=2, seed=0, stream=0)
    envset.collect(TagPolicy(), CPU, steps=3, batch_id=0)
    arrays, _ = envset.collect(TagPolicy(), CPU, steps=3, batch_id=1, reset=True)
    assert (arrays["step"][0] == 0).all() and (arrays["observation"][0, :, 0] == 1).all()


def test_policy_extras_and_random_steps_on_cartpole():
    env = gym.make("CartPole-v1")
    policy = ConstantPolicy(1, dtype=torch.int64)
    envset = EnvSet(EnvSpec("CartPole-v1"), n_envs=4, seed=3, stream=0)
    arrays, _ = envset.collect(policy, CPU, steps=50, batch_id=0, random_steps=20)
    assert (arrays["action"][20:] == 1).all()
    assert set(np.unique(arrays["action"][:20])) == {0, 1}
    pol = MLPPolicy(env.observation_space, env.action_space)
    arrays, _ = envset.collect(pol, CPU, steps=5, batch_id=1)
    assert arrays["log_prob"].shape == (5, 4) and arrays["log_prob"].dtype == np.float32
    assert arrays["observation"].dtype == np.float32 and arrays["action"].dtype == np.int64


def test_same_seed_same_data():
    env = gym.make("Pendulum-v1")
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        pol = MLPPolicy(env.observation_space, env.action_space)
        envset = EnvSet(EnvSpec("Pendulum-v1"), n_envs=2, seed=7, stream=1)
        runs.append(envset.collect(pol, CPU, steps=20, batch_id=0)[0])
    for k in runs[0]:
        assert np.array_equal(runs[0][k], runs[1][k]), k
    other = EnvSet(EnvSpec("Pendulum-v1"), n_envs=2, seed=7, stream=2)
    torch.manual_seed(0)
    arr = other.collect(MLPPolicy(env.observation_space, env.action_space), CPU, 20, 0)[0]
    assert not np.array_equal(arr["observation"][0], runs[0]["observation"][0])


def test_box_actions_are_clipped_for_the_env_but_stored_as_returned():
    runs = {}
    for torque in (5.0, 2.0):  # Pendulum's bound is 2
        envset = EnvSet(EnvSpec("Pendulum-v1"), n_envs=2, seed=0, stream=0)
        runs[torque] = envset.collect(ConstantPolicy([torque]), CPU, steps=10, batch_id=0)[0]
    assert (runs[5.0]["action"] == 5.0).all()  # stored: what the policy returned
    for key in ("next_observation", "reward"):  # stepped: the clipped action
        assert np.array_equal(runs[5.0][key], runs[2.0][key]), key


@pytest.mark.parametrize(("action", "message"), [
    (torch.zeros(2, 1, dtype=torch.int64), "has shape (2, 1), but env"),
    (torch.zeros(2), "has dtype torch.float32, but env"),
    (torch.full((2,), 5, dtype=torch.int64), "values outside env"),
])
def test_policy_output_that_does_not_fit_is_rejected(action, message):
    class Bad(torch.nn.Module):
        def forward(self, obs):
            return action

    envset = EnvSet(EnvSpec("CartPole-v1"), n_envs=2, seed=0, stream=0)
    with pytest.raises(PolicyError, match=re.escape(message)):
        envset.collect(Bad(), CPU, steps=2, batch_id=0)


def test_non_finite_observation_names_env_and_step():
    class NaNEnv(CountingEnv):
        def step(self, action):
            obs, r, term, trunc, info = super().step(action)
            if self.t == 3:
                obs[1] = np.nan
            return obs, r, term, trunc, info

    envset = EnvSet(EnvSpec(NaNEnv), n_envs=2, seed=0, stream=0)
    with pytest.raises(EnvError, match=r"env index 0\) returned a non-finite observation at step 2"):
        envset.collect(TagPolicy(), CPU, steps=5, batch_id=0)


def test_unknown_env_id_names_the_full_id():
    with pytest.raises(EnvError, match=re.escape("could not make env 'CartPol-v1'")):
        EnvSpec("CartPol-v1").probe()


def test_an_env_that_never_ends_an_episode_is_named():
    spec = EnvSpec(functools.partial(CountingEnv, 10**9), endless_episode_steps=50)
    envset = EnvSet(spec, 2, seed=0, stream=0)
    envset.collect(TagPolicy(), CPU, 30, batch_id=0)  # 30 steps: not yet endless
    with pytest.raises(EnvError, match=r"\(env index 0\) has run an episode of 60 steps without "
                                       r"terminating or truncating\. Set max_frames_per_traj"):
        envset.collect(TagPolicy(), CPU, 30, batch_id=1)


@pytest.mark.parametrize("limit", [0, -1, 2.5, True])
def test_the_endless_episode_limit_must_be_a_positive_int(limit):
    with pytest.raises(ConfigError, match="endless_episode_steps must be a positive int"):
        EnvSpec("CartPole-v1", endless_episode_steps=limit)
