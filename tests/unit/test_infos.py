"""info passthrough without Dask: ``info_keys`` entries stored as ``info/<key>`` with masks
``info/_<key>``, from single envs' infos and from a real gymnasium vector env's; episodes of
RecordEpisodeStatistics; clear errors for unknown, ragged and non-numeric entries."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from daskrl import ConfigError, EnvInfoError
from daskrl.config import CollectorConfig
from daskrl.testing import CountingEnv, InfoCountingEnv, TagPolicy, recorded_cartpole
from daskrl.worker._envs import EnvSpec
from daskrl.worker._infos import InfoRecorder
from daskrl.worker._rollout import EnvSet

CPU = torch.device("cpu")
KEYS = ("lives", "is_success", "pos")


def _envset(make, keys=KEYS, n_envs=3):
    return EnvSet(EnvSpec(make), n_envs=n_envs, seed=0, stream=0, info_keys=keys)


def test_info_entries_are_stored_per_step_with_their_masks():
    envset = _envset(lambda: InfoCountingEnv(4))
    outs = [envset.collect(TagPolicy(), CPU, steps=6, batch_id=b)[0] for b in range(2)]
    for out in outs:
        t = out["next_observation"][..., 1]
        assert out["info/lives"].dtype == np.int64
        assert np.array_equal(out["info/lives"], 4 - t) and out["info/_lives"].all()
        assert np.array_equal(out["info/pos"], out["next_observation"])
        assert out["info/pos"].dtype == np.float32 and out["info/_pos"].all()
        # reported at the terminating step only: the mask says where; 0 (False) elsewhere
        assert np.array_equal(out["info/_is_success"], out["terminated"])
        assert np.array_equal(out["info/is_success"], out["terminated"])
        assert out["info/is_success"].dtype == np.bool_
    plain = _envset(lambda: InfoCountingEnv(4), keys=()).collect(TagPolicy(), CPU, 6, 0)[0]
    assert not [k for k in plain if k.startswith("info")]


def test_an_entry_seen_before_is_all_masked_in_a_batch_without_it():
    envset = _envset(lambda: InfoCountingEnv(4), n_envs=2)
    envset.collect(TagPolicy(), CPU, steps=4, batch_id=0)  # every env ends at t=3
    out = envset.collect(TagPolicy(), CPU, steps=3, batch_id=1)[0]  # no end in it
    assert not out["terminated"].any()
    assert not out["info/_is_success"].any() and out["info/is_success"].shape == (3, 2)


def test_unknown_key_names_the_entries_the_envs_report():
    with pytest.raises(EnvInfoError, match=re.escape(
            "no env reported the info entry 'live' named in info_keys at any of the 6 steps of "
            "batch 3 (3 envs), nor before; the entries they reported: ['lives', 'pos']")):
        _envset(lambda: InfoCountingEnv(9), keys=("live",)).collect(TagPolicy(), CPU, 6, 3)
    # an entry reported only at episode ends, in a first batch without one: same error, and
    # what to do about it
    with pytest.raises(EnvInfoError, match="must appear in each stream's first batch"):
        _envset(lambda: InfoCountingEnv(9), keys=("is_success",)).collect(TagPolicy(), CPU, 6, 0)


@pytest.mark.parametrize("fault, problem", [
    ("ragged", "its info entry 'pos' has shape (3,), and earlier (2,): its shape varies"),
    ("string", "its info entry 'lives' is 'many' (str, dtype <U4), not a number"),
])
def test_ragged_and_non_numeric_entries_name_key_env_and_step(fault, problem):
    envset = _envset(lambda: InfoCountingEnv(9, fault=fault, at=3))
    with pytest.raises(EnvInfoError, match=re.escape(problem)) as e:
        envset.collect(TagPolicy(), CPU, steps=6, batch_id=4)
    assert "(env index 0) at step 2 of batch 4" in str(e.value)


class _Mixed(CountingEnv):
    """``score`` an int, then a float; ``stats`` a dict entry."""

    def step(self, action):
        obs, r, term, trunc, _ = super().step(action)
        score = self.t if self.t < 3 else self.t + 0.5
        return obs, r, term, trunc, {"score": score, "stats": {"a": self.t, "b": [1.0, 2.0]}}


def test_dtypes_promote_and_dict_entries_become_one_array_each():
    out = _envset(lambda: _Mixed(9), keys=("score", "stats")).collect(TagPolicy(), CPU, 5, 0)[0]
    assert out["info/score"].dtype == np.float64
    assert out["info/score"][:, 0].tolist() == [1, 2, 3.5, 4.5, 5.5]
    assert out["info/stats/a"].dtype == np.int64
    assert out["info/stats/a"][:, 0].tolist() == [1, 2, 3, 4, 5]
    assert out["info/stats/b"].shape == (5, 3, 2) and out["info/_stats"].all()


def test_info_keys_are_checked_on_the_learner():
    assert CollectorConfig(info_keys="lives").info_keys == ("lives",)
    assert CollectorConfig(info_keys=["lives", "pos", "lives"]).info_keys == ("lives", "pos")
    for bad in (["_lives"], ["TimeLimit.truncated"], [3]):
        with pytest.raises(ConfigError, match="info_keys"):
            CollectorConfig(info_keys=bad)


def _single_and_vector(n_envs=3, steps=11, length=4):
    """The same envs stepped one by one and as a SAME_STEP SyncVectorEnv: infos recorded the
    list way and the vector way (an ended env's step from ``final_info``)."""
    def make():
        return gym.wrappers.RecordEpisodeStatistics(InfoCountingEnv(length))

    singles = [make() for _ in range(n_envs)]
    for env in singles:
        env.reset(seed=0)
    vec = SyncVectorEnv([make for _ in range(n_envs)], autoreset_mode=AutoresetMode.SAME_STEP)
    vec.reset(seed=0)
    kw = {"env_name": "test", "batch_id": 0}
    a = InfoRecorder(KEYS, steps, n_envs, **kw)
    b = InfoRecorder(KEYS, steps, n_envs, **kw)
    for t in range(steps):
        infos, done = [], np.zeros(n_envs, bool)
        for i, env in enumerate(singles):
            _, _, term, trunc, info = env.step(0)
            done[i] = term or trunc
            infos.append(info)
            if done[i]:
                env.reset()
        a.record(t, infos, done=done)
        _, _, term, trunc, vinfo = vec.step(np.zeros(n_envs, np.int64))
        ended = term | trunc
        assert np.array_equal(ended, done)
        b.record(t, vinfo, envs=np.flatnonzero(~ended), done=ended)
        if ended.any():
            b.record(t, vinfo["final_info"], envs=np.flatnonzero(ended), done=ended)
    vec.close()
    return a, b


def test_vector_env_infos_give_the_same_arrays_as_single_envs():
    a, b = _single_and_vector()
    arrays_a, arrays_b = a.arrays(), b.arrays()
    assert sorted(arrays_a) == sorted(arrays_b) == sorted(
        [f"info/{k}" for k in KEYS] + [f"info/_{k}" for k in KEYS])
    for k in arrays_a:
        assert arrays_a[k].dtype == arrays_b[k].dtype, k
        assert np.array_equal(arrays_a[k], arrays_b[k]), k
    assert arrays_a["info/_is_success"].sum() == 3 * 2  # ends at t = 3 and 7
    assert [(r, n) for r, n, _ in a.episodes] == [(r, n) for r, n, _ in b.episodes] == [
        (10.0, 4)] * 6


def test_vector_info_rows_and_errors():
    rec = InfoRecorder(("lives",), 4, 3, env_name="v", batch_id=2)
    # envs at different rows (a vector env whose envs are not in step)
    rec.record(np.array([0, 1, 2]), {"lives": np.array([5, 6, 7]),
                                     "_lives": np.array([True, False, True])})
    out = rec.arrays()
    assert out["info/lives"][[0, 2], [0, 2]].tolist() == [5, 7]
    assert out["info/_lives"].sum() == 2 and not out["info/_lives"][1, 1]
    bad = InfoRecorder(("pos",), 4, 2, env_name="v", batch_id=2)
    ragged = np.empty(2, object)
    ragged[:] = [np.zeros(2), np.zeros(3)]
    with pytest.raises(EnvInfoError, match=re.escape(
            "(env index 1) at step 0 of batch 2: its info entry 'pos' has shape (3,)")):
        bad.record(0, {"pos": ragged, "_pos": np.array([True, True])})
    with pytest.raises(EnvInfoError, match=re.escape("(env index 0) at step 1 of batch 2: its "
                                                     "info entry 'pos' is np.str_('a')")):
        InfoRecorder(("pos",), 4, 2, env_name="v", batch_id=2).record(
            1, {"pos": np.array(["a", "b"]), "_pos": np.array([True, True])})
    with pytest.raises(EnvInfoError, match="must hold one entry per env"):
        InfoRecorder(("pos",), 4, 2, env_name="v", batch_id=2).record(0, {"pos": np.zeros(3)})


def test_record_episode_statistics_reach_the_batch_stats():
    envset = _envset(recorded_cartpole, keys=(), n_envs=4)
    torch.manual_seed(0)
    _, stats = envset.collect(TagPolicy(), CPU, steps=60, batch_id=0)
    assert len(stats["episode_returns"]) > 4
    assert [(r, n) for r, n, _ in stats["episode_stats"]] == list(
        zip(stats["episode_returns"], stats["episode_lengths"]))
    assert all(s > 0 for _, _, s in stats["episode_stats"])
    _, plain = _envset(lambda: gym.make("CartPole-v1"), keys=()).collect(TagPolicy(), CPU, 60, 0)
    assert plain["episode_returns"] and plain["episode_stats"] == ()
