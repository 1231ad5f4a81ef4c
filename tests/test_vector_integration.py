"""Vector envs with the rest of issue 15, end to end on real clusters: a ``Dict``-space vector
env stores and loads back exactly what single envs do; ``info_keys`` and episode statistics of
a vector env reach the store and the handles in each autoreset mode; lists of envs with vector
entries; ``daskrl collect`` (in this process, on the session's cluster) taking
``envs_per_worker`` from a vector env it imports; resume refusing other vector settings."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from cli_inprocess import daskrl_main
from gymnasium.vector import AutoresetMode

import daskrl
from daskrl import ResumeMismatchError
from daskrl.testing import CountingVectorEnv, TagPolicy, check_episode_continuity

pytestmark = pytest.mark.timeout(300)


def _equal(a, b) -> bool:
    if isinstance(a, dict):
        return sorted(a) == sorted(b) and all(_equal(a[k], b[k]) for k in a)
    return a.dtype == b.dtype and torch.equal(a, b)


def test_a_dict_space_vector_env_round_trips_as_single_envs_do(client, tmp_path):
    common = dict(client=client, envs_per_worker=3, frames_per_batch=15, total_frames=45,
                  num_workers=1, seed=3)
    loaded = {}
    for kind, extra in (("vector", {"vectorization_mode": "sync",
                                    "vector_kwargs": {"autoreset_mode": "SameStep"}}),
                        ("single", {})):
        url = str(tmp_path / kind)
        with daskrl.Collector("daskrl.testing:GoalCounting-v0", TagPolicy(), url, **common,
                              **extra) as c:
            handles = sorted(c, key=lambda h: h.batch_id)
        loaded[kind] = [h.load() for h in handles]
        check_episode_continuity(daskrl.open_store(url))
    assert len(loaded["vector"]) == 3
    for v, s in zip(loaded["vector"], loaded["single"]):
        assert sorted(v["observation"]) == ["achieved_goal", "desired_goal", "observation",
                                            "phase"]
        assert _equal(v, s)
        assert v["terminated"].any()


@pytest.mark.parametrize("mode", ("SameStep", "NextStep"))
def test_info_keys_and_episode_stats_of_a_vector_env(client, tmp_path, mode):
    url = str(tmp_path / "s")
    env = functools.partial(CountingVectorEnv, 3, 3, mode, dict_obs=True, infos=True)
    with daskrl.Collector(env, TagPolicy(), url, client=client, frames_per_batch=15,
                          total_frames=90, num_workers=2,
                          wrappers=("gymnasium.wrappers.vector.RecordEpisodeStatistics",),
                          info_keys=("t", "is_success")) as c:
        assert c.config.envs_per_worker == 3
        handles = list(c)
    store = daskrl.open_store(url)
    assert store.frames == 90
    check_episode_continuity(store)
    episodes = ends = 0
    for h in handles:
        b = h.load()
        nxt = b["next_observation"]["count"]
        assert torch.equal(nxt, b["observation"]["count"] + torch.tensor([0.0, 1.0]))
        assert torch.equal(b["info"]["t"], nxt[..., 1].long()) and b["info"]["_t"].all()
        assert torch.equal(b["info"]["_is_success"], b["terminated"])
        assert [(r, n) for r, n, _ in h.episode_stats] == list(
            zip(h.episode_returns, h.episode_lengths))
        assert store.handle(h.batch_id).episode_stats == h.episode_stats
        episodes += len(h.episode_stats)
        ends += int(b["terminated"].sum())
    assert episodes == ends > 10  # every stored end, once, also those of carried rows


def test_env_lists_with_a_vector_entry(client, tmp_path):
    url = str(tmp_path / "s")
    envs = [functools.partial(CountingVectorEnv, 3, 3, "SameStep"), "daskrl.testing:Counting-v0"]
    with daskrl.Collector(envs, TagPolicy(), url, client=client, frames_per_batch=15,
                          total_frames=60, num_workers=2) as c:
        assert c.config.envs_per_worker == 3
        handles = list(c)
    assert {h.env for h in handles} == {0, 1}
    assert all(h.shape == (5, 3) for h in handles)
    store = daskrl.open_store(url)
    check_episode_continuity(store)
    for h in handles:
        b = {k: v.numpy() for k, v in h.load().items()}
        assert np.array_equal(b["next_observation"], b["observation"] + np.array([0, 1]))


def test_cli_takes_envs_per_worker_from_the_vector_env_it_imports(cluster, tmp_path):
    """36 frames per batch is no multiple of the default envs_per_worker (8): the command
    must not refuse it before the env says num_envs=6."""
    store = tmp_path / "s"
    out = daskrl_main(
        "collect", "--env",
        "daskrl.testing:CountingVectorEnv", "--env-kwargs", '{"num_envs": 6, "infos": true}',
        "--info-keys", "t", "--frames", "72", "--frames-per-batch", "36", "--workers", "1",
        "--store", str(store), "--no-progress", "--scheduler", cluster.scheduler_address,
        cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    reader = daskrl.open_store(str(store))
    assert reader.frames == 72 and reader.runs()[0]["settings"]["envs_per_worker"] == 6
    for h in reader:
        b = h.load()
        assert h.shape == (6, 6)
        assert torch.equal(b["info"]["t"], b["next_observation"][..., 1].long())
    bad = daskrl_main(
        "collect", "--env",
        "daskrl.testing:CountingVectorEnv", "--env-kwargs", '{"num_envs": 6}',
        "--envs-per-worker", "4", "--frames", "72", "--frames-per-batch", "36",
        "--store", str(tmp_path / "t"), "--no-progress", "--scheduler",
        cluster.scheduler_address, cwd=tmp_path)
    assert bad.returncode != 0
    assert "builds a vector env of num_envs=6, but envs_per_worker=4 was given" in bad.stderr


def test_resume_refuses_other_vector_settings(client, tmp_path):
    url = str(tmp_path / "s")
    kw = dict(client=client, envs_per_worker=4, frames_per_batch=64, total_frames=128)
    with daskrl.Collector("CartPole-v1", TagPolicy(), url, vectorization_mode="sync",
                          vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP}, **kw) as c:
        list(c)
    with pytest.raises(ResumeMismatchError, match="vectorization_mode differs"):
        daskrl.Collector("CartPole-v1", TagPolicy(), url, vectorization_mode="async",
                         vector_kwargs={"autoreset_mode": "SameStep"}, resume=True, **kw)
    with pytest.raises(ResumeMismatchError, match="vector_kwargs differs"):
        daskrl.Collector("CartPole-v1", TagPolicy(), url, vectorization_mode="sync",
                         resume=True, **kw)
    # the same settings (the mode given by its value) resume: nothing is left to collect
    with daskrl.Collector("CartPole-v1", TagPolicy(), url, vectorization_mode="sync",
                          vector_kwargs={"autoreset_mode": "SameStep"}, resume=True, **kw) as c:
        assert c.resumed is not None and c.resumed.complete
