"""Vector envs with the rest of issue 15: Dict/Tuple spaces through SpaceLayout (the same arrays
as single envs), ``info_keys`` and episode statistics from the vector ``info`` in every
autoreset mode (``final_info`` in SAME_STEP; rows at their own pace in the staggered mode),
wrappers (per sub-env with ``gymnasium.make_vec``, vector wrappers on any vector env, a clear
refusal otherwise), lists of envs with vector entries, and resume's checks of the vector
settings."""

from __future__ import annotations

import functools
import re

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from daskrl import ConfigError, ResumeMismatchError, WrapperError
from daskrl._settings import parse_wrappers
from daskrl.collect._env_list import resolve_envs
from daskrl.collect._resume import check_settings, run_settings
from daskrl.config import CollectorConfig
from daskrl.testing import (
    CountingEnv,
    CountingVectorEnv,
    GoalCountingEnv,
    SpacePolicy,
    TagPolicy,
    TupleCountingEnv,
)
from daskrl.worker._envs import EnvSpec
from daskrl.worker._rollout import EnvSet

CPU = torch.device("cpu")
MODES = ("NextStep", "SameStep", "Disabled")


def _sync(make, n: int, mode: str):
    return lambda: SyncVectorEnv([make] * n, autoreset_mode=mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("make", [functools.partial(GoalCountingEnv, 4, True),
                                  functools.partial(TupleCountingEnv, 3)],
                         ids=["dict", "tuple"])
def test_structured_spaces_store_what_single_envs_store(make, mode):
    E = 3
    vec = EnvSet(EnvSpec(_sync(make, E, mode), num_envs=E), E, seed=7, stream=1)
    one = EnvSet(EnvSpec(make), E, seed=7, stream=1)
    policy = SpacePolicy(one.act_space)
    for batch_id, random_steps in ((0, 3), (1, 0)):
        torch.manual_seed(batch_id)
        v_out, v_stats = vec.collect(policy, CPU, steps=7, batch_id=batch_id,
                                     random_steps=random_steps)
        torch.manual_seed(batch_id)
        s_out, s_stats = one.collect(policy, CPU, steps=7, batch_id=batch_id,
                                     random_steps=random_steps)
        assert sorted(v_out) == sorted(s_out)
        assert any(k.startswith("observation/") for k in v_out)
        assert any(k.startswith("action/") for k in v_out)
        for k in s_out:
            assert v_out[k].dtype == s_out[k].dtype, k
            np.testing.assert_array_equal(v_out[k], s_out[k], err_msg=k)
        assert v_stats["episode_lengths"] == s_stats["episode_lengths"]
        assert v_out["terminated"].any()
    vec.close()
    one.close()


def _check_counting(out: dict, lengths: np.ndarray) -> None:
    """Every row a real transition of a CountingVectorEnv(dict_obs=True, infos=True)."""
    obs, nxt = out["observation/count"], out["next_observation/count"]
    np.testing.assert_array_equal(nxt, obs + np.array([0, 1], np.float32))
    np.testing.assert_array_equal(out["next_observation/parity"][..., 0], nxt[..., 1] % 2)
    np.testing.assert_array_equal(out["observation/parity"][..., 0], obs[..., 1] % 2)
    ended = out["terminated"]
    np.testing.assert_array_equal(nxt[..., 1][ended], np.broadcast_to(lengths, ended.shape)[ended])
    assert out["info/_t"].all()
    np.testing.assert_array_equal(out["info/t"], nxt[..., 1].astype(np.int64))
    np.testing.assert_array_equal(out["info/_is_success"], ended)
    np.testing.assert_array_equal(out["info/is_success"], ended)


@pytest.mark.parametrize("mode", MODES)
def test_infos_and_dict_observations_of_a_native_vector_env_in_each_mode(mode):
    E, L = 3, 3
    spec = EnvSpec(functools.partial(CountingVectorEnv, E, L, mode, dict_obs=True, infos=True),
                   num_envs=E)
    envset = EnvSet(spec, E, seed=0, stream=0, info_keys=("t", "is_success"))
    assert envset.staggered == (mode == "NextStep")  # its own reset steps are skipped
    last = None
    for batch_id in range(4):
        out, stats = envset.collect(TagPolicy(), CPU, steps=5, batch_id=batch_id)
        _check_counting(out, L + np.arange(E))
        if last is not None:  # episodes continue across batches
            cont = ~(last["terminated"][-1] | last["truncated"][-1])
            np.testing.assert_array_equal(out["observation/count"][0][cont],
                                          last["next_observation/count"][-1][cont])
        last = out
        assert stats["episode_stats"] == ()  # no RecordEpisodeStatistics here
    envset.close()


@pytest.mark.parametrize("mode", ("NextStep", "SameStep"))
def test_sub_env_record_episode_statistics_reach_the_stats(mode):
    E = 3
    makes = [lambda n=n: gym.wrappers.RecordEpisodeStatistics(CountingEnv(3 + n))
             for n in range(E)]
    spec = EnvSpec(lambda: SyncVectorEnv(makes, autoreset_mode=mode), num_envs=E)
    envset = EnvSet(spec, E, seed=0, stream=0, info_keys=("episode",))
    for batch_id in range(2):
        out, stats = envset.collect(TagPolicy(), CPU, steps=9, batch_id=batch_id)
        assert len(stats["episode_stats"]) == len(stats["episode_lengths"]) > 3
        assert [(r, n) for r, n, _ in stats["episode_stats"]] == list(
            zip(stats["episode_returns"], stats["episode_lengths"]))
        done = out["terminated"] | out["truncated"]
        np.testing.assert_array_equal(out["info/_episode"], done)
        assert out["info/episode/l"][done].tolist() == [n for _, n, _ in stats["episode_stats"]]
    envset.close()


def test_vector_wrapper_by_spec_on_a_staggered_vector_env():
    """gymnasium.wrappers.vector.RecordEpisodeStatistics named as a wrapper spec, on a vector
    env whose NEXT_STEP reset steps daskrl skips: the episodes it reports are the stored ones,
    also those that end in rows carried to the next batch."""
    E, L = 3, 2
    spec = EnvSpec(functools.partial(CountingVectorEnv, E, L, "NextStep"),
                   wrappers=parse_wrappers(["gymnasium.wrappers.vector.RecordEpisodeStatistics"]))
    spec, _, _ = spec.inspect()
    envset = EnvSet(spec, E, seed=0, stream=0)
    assert envset.staggered
    total = 0
    for batch_id in range(3):
        _, stats = envset.collect(TagPolicy(), CPU, steps=4, batch_id=batch_id)
        assert [(r, n) for r, n, _ in stats["episode_stats"]] == list(
            zip(stats["episode_returns"], stats["episode_lengths"]))
        total += len(stats["episode_stats"])
    assert total > 6
    envset.close()


def test_single_env_wrappers_wrap_each_sub_env_of_make_vec():
    spec = EnvSpec("Counting-v0", vectorization_mode="sync", num_envs=2,
                   wrappers=parse_wrappers(["gymnasium.wrappers.TimeLimit:max_episode_steps=2"]))
    envset = EnvSet(spec, 2, seed=0, stream=0)
    out, stats = envset.collect(TagPolicy(), CPU, steps=6, batch_id=0)
    assert set(stats["episode_lengths"]) == {2} and out["truncated"][1::2].all()
    envset.close()


@pytest.mark.parametrize("env, mode, todo", [
    (functools.partial(CountingVectorEnv, 2), None,
     "Use its vector form gymnasium.wrappers.vector.ClipReward, or apply it to each sub-env "
     "inside the factory"),
    ("CartPole-v1", "vector_entry_point", "gymnasium.wrappers.vector.ClipReward"),
])
def test_single_env_wrapper_on_a_vector_env_daskrl_does_not_build_is_refused(env, mode, todo):
    wrappers = parse_wrappers(["gymnasium.wrappers.ClipReward:min_reward=0"])
    spec = EnvSpec(env, vectorization_mode=mode, num_envs=2 if mode else None, wrappers=wrappers)
    with pytest.raises(WrapperError, match=re.escape(todo)) as info:
        spec.inspect()
    assert "'gymnasium.wrappers.ClipReward:min_reward=0' wraps single envs" in str(info.value)


def test_a_sub_env_wrapper_after_a_vector_wrapper_is_refused():
    wrappers = parse_wrappers(["gymnasium.wrappers.vector.RecordEpisodeStatistics",
                               "gymnasium.wrappers.TimeLimit:max_episode_steps=2"])
    with pytest.raises(WrapperError, match="Give the sub-env wrappers first"):
        EnvSpec("Counting-v0", vectorization_mode="sync", num_envs=2, wrappers=wrappers).inspect()


def test_env_lists_with_vector_entries():
    three = functools.partial(CountingVectorEnv, 3)
    values = {"num_workers": 2, "frames_per_batch": 30, "total_frames": 60}
    mixed = resolve_envs([three, "daskrl.testing:Counting-v0"], values, False)
    assert mixed.config.envs_per_worker == 3  # the single env's stream steps 3 envs too
    assert [s.num_envs for s in mixed.specs] == [3, None]
    with pytest.raises(ConfigError, match=re.escape(
            "env 0 (factory daskrl.testing.CountingVectorEnv) has num_envs=3 and env 2 "
            "(factory daskrl.testing.CountingVectorEnv) has num_envs=4")):
        resolve_envs([three, "daskrl.testing:Counting-v0",
                      functools.partial(CountingVectorEnv, 4)], {"frames_per_batch": 36, "total_frames": 72}, False)
    with pytest.raises(ConfigError, match="but envs_per_worker=2 was given"):
        resolve_envs([three, three], {"envs_per_worker": 2, "frames_per_batch": 30, "total_frames": 60}, True)


def test_resume_checks_the_vector_settings():
    space = gym.spaces.Discrete(2)

    def settings(**kw):
        return run_settings("CartPole-v1", space, space, CollectorConfig(**kw))

    run = settings(vectorization_mode="sync",
                   vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP})
    assert run["vector_kwargs"] == {"autoreset_mode": "SameStep"}  # plain JSON
    check_settings(0, run, settings(vectorization_mode="sync",
                                    vector_kwargs={"autoreset_mode": "SameStep"}), "s")
    for other, field in ((settings(vectorization_mode="async",
                                   vector_kwargs={"autoreset_mode": "SameStep"}),
                          "vectorization_mode"),
                         (settings(vectorization_mode="sync"), "vector_kwargs")):
        with pytest.raises(ResumeMismatchError, match=f"{field} differs") as info:
            check_settings(0, run, other, "s")
        assert info.value.field == field
