"""Rollouts on vector envs, without Dask: in every autoreset mode only real transitions are
stored, with their true final observations, and the same ids, steps and seeds as single envs."""

from __future__ import annotations

import functools
import re

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import SyncVectorEnv

from daskrl import ConfigError, EnvError
from daskrl.collect._env_list import resolve_envs
from daskrl.config import CollectorConfig
from daskrl.policies import MLPPolicy
from daskrl.testing import ConstantPolicy, CountingEnv, CountingVectorEnv, FaultyEnv, TagPolicy
from daskrl.worker._envs import EnvSpec
from daskrl.worker._rollout import EPISODE_ID_STRIDE, EnvSet
from daskrl.worker._vector_envs import env_seed

CPU = torch.device("cpu")
MODES = ("NextStep", "SameStep", "Disabled")


def _sync(mode: str, n: int = 3, length: int = 3) -> EnvSpec:
    """A SyncVectorEnv of CountingEnvs of lengths ``length + i``."""
    return EnvSpec(lambda: SyncVectorEnv(
        [functools.partial(CountingEnv, length + i) for i in range(n)], autoreset_mode=mode),
        num_envs=n)


def _native(mode: str, n: int = 3, length: int = 3) -> EnvSpec:
    return EnvSpec(functools.partial(CountingVectorEnv, n, length, mode), num_envs=n)


def _collect(envset, steps: list[int], policy=None, first_id: int = 0):
    policy = policy or TagPolicy()
    batches = []
    for b, T in enumerate(steps):
        arrays, stats = envset.collect(policy, CPU, steps=T, batch_id=first_id + b)
        batches.append((first_id + b, arrays, stats))
    return batches


def check_counting(batches, lengths) -> None:
    """Every transition real and every episode whole, column by column across batches."""
    E = len(lengths)
    data = {k: np.concatenate([a[k] for _, a, _ in batches]) for k in batches[0][1]}
    obs, nxt = data["observation"], data["next_observation"]
    # the counting rule: no reset step ([e, L] -> [e + 1, 0]) is stored as a transition
    assert np.array_equal(nxt, obs + np.array([0, 1]))
    assert np.array_equal(data["reward"], nxt[..., 1])
    assert np.array_equal(data["step"], obs[..., 1])
    # the true final observation ends each episode, at the env's own length
    assert np.array_equal(data["terminated"], nxt[..., 1] == np.asarray(lengths))
    assert not data["truncated"].any()
    for e in range(E):
        col = obs[:, e]
        # episodes follow each other without a gap: after an end, the next one's first obs
        ends = np.flatnonzero(data["terminated"][:-1, e])
        assert np.array_equal(col[ends + 1], np.stack([col[ends, 0] + 1, 0 * ends], 1))
        assert np.array_equal(np.unique(col[:, 0]), np.arange(col[0, 0], col[-1, 0] + 1))
    # one id per (column, episode), never shared; it names the batch and row it starts in
    ids = data["episode_id"]
    for e in range(E):
        pairs = set(zip(ids[:, e].tolist(), obs[:, e, 0].tolist()))
        assert len(pairs) == len({p[0] for p in pairs}) == len({p[1] for p in pairs})
    previous = None  # (batch id, T) of the batch before
    for bid, arrays, _ in batches:
        for t, e in np.argwhere(arrays["step"] == 0).tolist():
            here = bid * EPISODE_ID_STRIDE + t * E + e
            # or, for an episode begun at the previous batch's end, that batch at row T
            before = (previous[0] * EPISODE_ID_STRIDE + previous[1] * E + e
                      if previous is not None and t == 0 else None)
            assert arrays["episode_id"][t, e] in (here, before), (bid, t, e)
        previous = (bid, arrays["step"].shape[0])
    assert (ids >= 0).all()
    # episode returns and lengths: one per stored end, with the batch that stores it
    for _, arrays, stats in batches:
        ended = arrays["terminated"]
        want = sorted(int(x) for x in arrays["step"][ended] + 1)
        assert sorted(stats["episode_lengths"]) == want
        assert sorted(stats["episode_returns"]) == sorted(n * (n + 1) / 2 for n in want)


@pytest.mark.parametrize("mode", MODES)
def test_sync_vector_env_stores_only_real_transitions(mode):
    envset = EnvSet(_sync(mode), 3, seed=0, stream=0)
    assert not envset.staggered  # SyncVectorEnv resets ended sub-envs alone
    check_counting(_collect(envset, [7, 7, 5, 7]), [3, 4, 5])
    envset.close()


@pytest.mark.parametrize("mode", MODES)
def test_native_vector_env_stores_only_real_transitions(mode):
    envset = EnvSet(_native(mode), 3, seed=0, stream=0)
    assert envset.staggered == (mode == "NextStep")
    batches = _collect(envset, [7, 7, 2, 1, 7, 9])
    check_counting(batches, [3, 4, 5])
    envset.close()


def test_next_step_columns_run_ahead_and_open_the_next_batch():
    """CountingVectorEnv resets every sub-env on reset(): its reset steps are skipped, each
    column fills at its own pace, and what a column made past T opens the next batch."""
    envset = EnvSet(_native("NextStep", n=3, length=1), 3, seed=0, stream=0)
    carried = []
    batches = []
    for b, T in enumerate([4, 4, 1, 1, 4]):
        batches.append((b, *envset.collect(TagPolicy(), CPU, steps=T, batch_id=b)))
        carried.append(envset._staggered._carry_n.tolist())
    # length-1 episodes in column 0 take two vector steps each; length-3 ones in column 2 four
    # for three transitions: column 2 runs ahead of column 0 within a batch.
    assert any(max(c) > 0 for c in carried), carried
    assert any(max(c) > 1 for c in carried), carried  # more carry than a short batch holds
    check_counting(batches, [1, 2, 3])


def test_next_step_carry_keeps_episode_ids_named_where_they_start():
    envset = EnvSet(_native("NextStep", n=2, length=1), 2, seed=0, stream=0)
    batches = [(10 + b, *envset.collect(TagPolicy(), CPU, steps=T, batch_id=10 + b))
               for b, T in enumerate([3, 1, 1, 1, 3])]
    check_counting(batches, [1, 2])


def test_same_data_as_single_envs_seeds_ids_and_random_actions():
    """A SyncVectorEnv of CartPoles collects what a list of single CartPoles does: the same
    seeds per sub-env, episode ids, steps, random actions and episode statistics."""
    env = gym.make("CartPole-v1")
    policy = MLPPolicy(env.observation_space, env.action_space)
    env.close()
    single = EnvSet(EnvSpec("CartPole-v1"), 4, seed=5, stream=2)
    vector = EnvSet(EnvSpec("CartPole-v1", vectorization_mode="sync", num_envs=4), 4,
                          seed=5, stream=2)
    for b in range(3):
        torch.manual_seed(b)
        a, sa = single.collect(policy, CPU, steps=40, batch_id=b, random_steps=10)
        torch.manual_seed(b)
        v, sv = vector.collect(policy, CPU, steps=40, batch_id=b, random_steps=10)
        assert a.keys() == v.keys()
        for k in a:
            assert np.array_equal(a[k], v[k]), k
        assert sa["episode_returns"] == sv["episode_returns"]
        assert sa["episode_lengths"] == sv["episode_lengths"]
    single.close()
    vector.close()


def test_vector_entry_point_cartpole_stores_no_reset_step():
    """CartPoleVectorEnv (NEXT_STEP, no partial reset): a reset step would be a reward of 0;
    every stored reward is 1, terminal next observations are past the thresholds, others not."""
    spec = EnvSpec("CartPole-v1", vectorization_mode="vector_entry_point", num_envs=4)
    envset = EnvSet(spec, 4, seed=0, stream=0)
    assert envset.staggered
    batches = _collect(envset, [60, 60, 60], policy=ConstantPolicy(0))
    data = {k: np.concatenate([a[k] for _, a, _ in batches]) for k in batches[0][1]}
    assert (data["reward"] == 1).all()
    nxt = data["next_observation"]
    outside = (np.abs(nxt[..., 0]) > 2.4) | (np.abs(nxt[..., 2]) > 12 * 2 * np.pi / 360)
    assert np.array_equal(outside, data["terminated"]) and data["terminated"].sum() > 10
    # within an episode each observation is the previous next_observation
    same_episode = data["episode_id"][1:] == data["episode_id"][:-1]
    assert np.array_equal(data["observation"][1:][same_episode], nxt[:-1][same_episode])
    envset.close()


def test_sub_env_error_names_its_index():
    factories = [functools.partial(CountingEnv, 3),
                 functools.partial(FaultyEnv, "raise", at=4, token="vector-index")]
    spec = EnvSpec(lambda: SyncVectorEnv(factories), num_envs=2)
    envset = EnvSet(spec, 2, seed=0, stream=0)
    with pytest.raises(EnvError, match=re.escape("(env index 1) raised in step() at step 3 of "
                                                 "batch 7")) as info:
        envset.collect(TagPolicy(), CPU, steps=10, batch_id=7)
    assert "injected step failure" in str(info.value)
    envset.close()


def test_same_step_env_without_final_obs_names_the_sub_env():
    class NoFinal(CountingVectorEnv):
        def step(self, actions):
            obs, r, te, tr, _ = super().step(actions)
            return obs, r, te, tr, {}

    spec = EnvSpec(lambda: NoFinal(2, 2, "SameStep"), num_envs=2)
    envset = EnvSet(spec, 2, seed=0, stream=0)
    with pytest.raises(EnvError, match=re.escape("(env index 0) ended an episode at step 1 of "
                                                 "batch 0")):
        envset.collect(TagPolicy(), CPU, steps=5, batch_id=0)


def test_reset_mask_that_resets_everything_is_an_error():
    class ResetsAll(CountingVectorEnv):
        def reset(self, *, seed=None, options=None):
            return super().reset(seed=seed)  # ignores the mask

    envset = EnvSet(EnvSpec(lambda: ResetsAll(2, 2, "Disabled"), num_envs=2), 2, 0, 0)
    with pytest.raises(EnvError, match="changed the observations of sub-envs outside the mask"):
        envset.collect(TagPolicy(), CPU, steps=5, batch_id=0)


def test_mislabelled_autoreset_mode_is_an_error():
    """An env that autoresets in the same step but declares NEXT_STEP would lose a real step
    to a supposed reset step: its reward and end give it away."""
    class Mislabelled(CountingVectorEnv):
        def __init__(self):
            super().__init__(2, 2, "SameStep")
            self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}

    envset = EnvSet(EnvSpec(Mislabelled, num_envs=2), 2, seed=0, stream=0)
    with pytest.raises(EnvError, match=re.escape("(env index 0) returned reward=1.0")):
        envset.collect(TagPolicy(), CPU, steps=5, batch_id=0)


def test_vector_env_outputs_are_checked():
    class BadReward(CountingVectorEnv):
        def step(self, actions):
            obs, r, te, tr, info = super().step(actions)
            return obs, r[:1], te, tr, info

    envset = EnvSet(EnvSpec(lambda: BadReward(2), num_envs=2), 2, seed=0, stream=0)
    with pytest.raises(EnvError, match=re.escape("reward of shape (1,)")):
        envset.collect(TagPolicy(), CPU, steps=5, batch_id=0)


def test_num_envs_sets_envs_per_worker_and_a_different_one_is_an_error():
    spec, obs_space, _ = EnvSpec(functools.partial(CountingVectorEnv, 4)).inspect()
    assert spec.num_envs == 4 and obs_space.shape == (2,)
    values = {"frames_per_batch": 64, "total_frames": 128}
    four = functools.partial(CountingVectorEnv, 4)
    assert resolve_envs(four, values, given=False).config.envs_per_worker == 4
    # the default envs_per_worker (8) is not checked against frames_per_batch first
    assert resolve_envs(four, {"frames_per_batch": 12}, given=False).config.envs_per_worker == 4
    with pytest.raises(ConfigError, match=re.escape(
            "builds a vector env of num_envs=4, but envs_per_worker=8 was given")):
        resolve_envs(four, {**values, "envs_per_worker": 8}, given=True)
    with pytest.raises(ConfigError, match=re.escape(
            "so envs_per_worker=3: frames_per_batch=64 is not a multiple")):
        resolve_envs(functools.partial(CountingVectorEnv, 3), values, given=False)


def test_vector_options_are_checked():
    with pytest.raises(ConfigError, match="vectorization_mode must be one of"):
        CollectorConfig(vectorization_mode="threads")
    with pytest.raises(ConfigError, match="give vectorization_mode too"):
        CollectorConfig(vector_kwargs={"copy": False})
    with pytest.raises(ConfigError, match="applies to a gymnasium id"):
        EnvSpec(CountingEnv, vectorization_mode="sync", num_envs=2)
    with pytest.raises(ConfigError, match="cannot add a time limit"):
        EnvSpec(functools.partial(CountingVectorEnv, 2), max_episode_steps=5).inspect()
    with pytest.raises(EnvError, match="vector_kwargs"):
        EnvSpec("CartPole-v1", vectorization_mode="sync", num_envs=2,
                vector_kwargs={"nonsense": 1}).make_vector()


def test_id_with_vectorization_mode_takes_max_episode_steps():
    for mode in ("sync", "vector_entry_point"):
        spec = EnvSpec("CartPole-v1", max_episode_steps=5, vectorization_mode=mode, num_envs=2)
        envset = EnvSet(spec, 2, seed=0, stream=0)
        arrays, _ = envset.collect(TagPolicy(), CPU, steps=12, batch_id=0)
        assert arrays["step"].max() <= 4 and arrays["truncated"].any(), mode
        envset.close()


def test_env_seed_reaches_the_factory_one_per_stream():
    seen = []

    def factory():
        seen.append(env_seed(default=-1))
        return CountingVectorEnv(2)

    spec = EnvSpec(factory, num_envs=2)
    for stream in (0, 1):
        EnvSet(spec, 2, seed=3, stream=stream).close()
    EnvSet(spec, 2, seed=3, stream=0).close()
    assert seen[0] != seen[1] and seen[0] == seen[2] and min(seen) >= 0
    assert env_seed(default=-1) == -1  # outside a build


@pytest.mark.parametrize("mode", MODES)
def test_reset_at_each_batch_starts_every_sub_env_anew(mode):
    """reset_at_each_iter: every batch starts fresh episodes in every column (what a column
    made past the last batch goes with the envs' old state)."""
    envset = EnvSet(_native(mode, n=3, length=1), 3, seed=0, stream=0)
    for b in range(3):
        arrays, _ = envset.collect(TagPolicy(), CPU, steps=5, batch_id=b, reset=True)
        assert (arrays["step"][0] == 0).all()
        assert np.array_equal(arrays["episode_id"][0], b * EPISODE_ID_STRIDE + np.arange(3))
        assert np.array_equal(arrays["next_observation"],
                              arrays["observation"] + np.array([0, 1]))
    envset.close()


def test_random_steps_sample_each_columns_own_action_space():
    spec = EnvSpec("CartPole-v1", vectorization_mode="vector_entry_point", num_envs=4)
    runs = []
    for _ in range(2):
        envset = EnvSet(spec, 4, seed=1, stream=0)
        arrays, _ = envset.collect(ConstantPolicy(0), CPU, steps=30, batch_id=0,
                                   random_steps=20)
        runs.append(arrays["action"])
        envset.close()
    assert np.array_equal(runs[0], runs[1])  # seeded
    assert runs[0][:15].any() and not runs[0][25:].any()  # random first, then the policy's
    assert not np.array_equal(runs[0][:15, 0], runs[0][:15, 1])  # a seed per column


def test_non_finite_reward_of_a_sub_env_names_its_index_and_the_next_batch_resets():
    class NaNRewardEnv(CountingEnv):
        def step(self, action):
            obs, r, term, trunc, info = super().step(action)
            return obs, (float("nan") if self.t == 3 else r), term, trunc, info

    spec = EnvSpec(lambda: SyncVectorEnv([functools.partial(CountingEnv, 10),
                                          functools.partial(NaNRewardEnv, 10)]), num_envs=2)
    envset = EnvSet(spec, 2, seed=0, stream=0)
    with pytest.raises(EnvError, match=r"env index 1\) returned a non-finite reward at step 2"):
        envset.collect(TagPolicy(), CPU, steps=5, batch_id=0)
    arrays, _ = envset.collect(TagPolicy(), CPU, steps=2, batch_id=1)  # reset after the error
    assert np.isfinite(arrays["reward"]).all() and arrays["reward"].shape == (2, 2)
