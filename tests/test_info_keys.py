"""info passthrough end to end on a real LocalCluster: ``info_keys`` entries (``lives``, a
success flag, a vector) stored per step with their masks and loaded nested; the episodes of a
RecordEpisodeStatistics-wrapped CartPole on the handles, matching the store's episodes();
unknown and ragged entries refused on the worker with the env index, surfaced to the learner
(not retried); ``--info-keys`` on the command line (``daskrl collect`` in this process, on the
session's cluster)."""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest
import torch
from cli_inprocess import daskrl_main

import daskrl
import daskrl.data
from daskrl import EnvInfoError
from daskrl.testing import InfoCountingEnv, TagPolicy, recorded_cartpole

pytestmark = pytest.mark.timeout(300)

WHERE = r"\n\[worker tcp://127\.0\.0\.1:\d+, weights version 0\]$"


def test_info_entries_reach_the_store_with_their_masks(client, tmp_path):
    url = str(tmp_path / "s")
    with daskrl.Collector(functools.partial(InfoCountingEnv, 4), TagPolicy(), url,
                          client=client, envs_per_worker=3, frames_per_batch=15,
                          total_frames=60, num_workers=2,
                          info_keys=("lives", "is_success", "pos")) as c:
        handles = list(c)
    store = daskrl.open_store(url)
    assert store.runs()[0]["settings"]["info_keys"] == ["lives", "is_success", "pos"]
    for h in handles:
        b = h.load()
        info, t = b["info"], b["next_observation"][..., 1]
        assert sorted(info) == ["_is_success", "_lives", "_pos", "is_success", "lives", "pos"]
        assert info["lives"].dtype == torch.int64 and torch.equal(info["lives"], 4 - t.long())
        assert info["_lives"].all() and info["_pos"].all()
        assert torch.equal(info["pos"], b["next_observation"])
        assert torch.equal(info["_is_success"], b["terminated"])
        assert torch.equal(info["is_success"], b["terminated"])
    only = store.load(handles[0].batch_id, keys=["info/lives"])
    assert list(only) == ["info"] and list(only["info"]) == ["lives"]
    ep = next(daskrl.data.episodes(store, ["info", "reward"]))
    assert ep.data["info"]["lives"].tolist() == [3, 2, 1, 0]
    assert ep.data["info"]["_is_success"].tolist() == [False, False, False, True]


def test_record_episode_statistics_reach_the_handles(client, tmp_path):
    url = str(tmp_path / "s")
    torch.manual_seed(0)
    with daskrl.Collector(recorded_cartpole, TagPolicy(), url, client=client,
                          envs_per_worker=4, frames_per_batch=256, total_frames=1024,
                          num_workers=2, info_keys=("episode",)) as c:
        handles = list(c)
    store = daskrl.open_store(url)
    stats = []
    for h in handles:
        assert [(r, n) for r, n, _ in h.episode_stats] == list(
            zip(h.episode_returns, h.episode_lengths))
        assert store.handle(h.batch_id).episode_stats == h.episode_stats  # commit record
        stats += h.episode_stats
        # the same episodes as stored arrays: info/episode/{r,l,t} where info/_episode says
        b = h.load(keys=["info", "terminated", "truncated"])
        mask = b["info"]["_episode"]  # rows in time order, envs in order: as episode_stats
        assert torch.equal(mask, b["terminated"] | b["truncated"])
        assert b["info"]["episode"]["r"][mask].tolist() == [r for r, _, _ in h.episode_stats]
        assert b["info"]["episode"]["l"][mask].tolist() == [n for _, n, _ in h.episode_stats]
    recorded = sorted((r, n) for r, n, _ in stats)
    episodes = sorted((e.total_reward, e.length) for e in daskrl.data.episodes(store, ["reward"]))
    assert len(recorded) > 10 and recorded == episodes


@pytest.mark.parametrize("env, keys, problem", [
    (functools.partial(InfoCountingEnv, 9, fault="ragged", at=3), ("pos",),
     r"env factory daskrl\.testing\.InfoCountingEnv \(env index 0\) at step 2 of batch \d+: "
     r"its info entry 'pos' has shape \(3,\), and earlier \(2,\): its shape varies \(ragged\)"),
    (functools.partial(InfoCountingEnv, 9), ("live",),
     r"env factory daskrl\.testing\.InfoCountingEnv: no env reported the info entry 'live' "
     r"named in info_keys at any of the 4 steps of batch \d+ \(2 envs\), nor before; the "
     r"entries they reported: \['lives', 'pos'\]"),
])
def test_unknown_and_ragged_entries_fail_on_the_worker_and_are_not_retried(
        client, tmp_path, env, keys, problem):
    def built() -> int:
        return sum(client.run(lambda: InfoCountingEnv.instances).values())

    before = built()
    with (
        daskrl.Collector(env, TagPolicy(), str(tmp_path / "s"), client=client, num_workers=1,
                         envs_per_worker=2, frames_per_batch=8, total_frames=32,
                         info_keys=keys, on_env_error="restart") as c,
        pytest.raises(EnvInfoError) as info,
    ):
        list(c)
    assert re.search(problem, str(info.value)), str(info.value)
    assert re.search(WHERE, str(info.value)), str(info.value)
    assert built() - before == 2  # one env set: on_env_error="restart" rebuilt none
    assert daskrl.open_store(str(tmp_path / "s")).batch_ids() == []


def test_cli_info_keys(cluster, tmp_path):
    store = tmp_path / "demo"
    base = ["collect", "--env", "daskrl.testing:InfoCounting-v0", "--frames", "32",
            "--frames-per-batch", "16", "--envs-per-worker", "4", "--workers", "1",
            "--no-progress", "--scheduler", cluster.scheduler_address]
    out = daskrl_main(*base, "--store", str(store), "--info-keys", "lives", "pos",
                      cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    s = daskrl.open_store(str(store))
    b = s.load(s.batch_ids()[0])
    assert sorted(b["info"]) == ["_lives", "_pos", "lives", "pos"]
    assert np.array_equal(b["info"]["pos"].numpy(), b["next_observation"].numpy())
    bad = daskrl_main(*base, "--store", str(tmp_path / "x"), "--info-keys", "TimeLimit.x",
                      cwd=tmp_path)
    assert bad.returncode == 3, bad.stderr
    assert "info_keys has 'TimeLimit.x'" in bad.stderr
