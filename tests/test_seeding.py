"""Seeding: every env has its own seed stream; the conditions of docs/reproducibility.md hold."""

from __future__ import annotations

import torch

import daskrl


def _collect(client, url, policy, seed, **kw):
    args = {"envs_per_worker": 4, "frames_per_batch": 80, "total_frames": 320} | kw
    with daskrl.Collector("CartPole-v1", policy, url, client=client, seed=seed, **args) as c:
        handles = list(c)
    return [h.load() for h in handles], handles


def test_every_env_of_every_stream_has_its_own_seed_stream(client, tmp_path, cartpole_policy):
    data, handles = _collect(client, str(tmp_path / "s"), cartpole_policy, seed=3)
    assert [h.batch_id for h in handles] == [0, 1, 2, 3]
    assert len({h.worker for h in handles}) == 2  # two streams, one per worker
    # The first observations of the 8 envs (4 per stream) all differ ...
    first = torch.cat([data[0]["observation"][0], data[1]["observation"][0]])
    assert len({tuple(x.tolist()) for x in first}) == 8
    # ... and so do the envs' whole trajectories within a batch (observations and actions).
    for d in data:
        for key in ("observation", "action"):
            per_env = d[key].transpose(0, 1).reshape(4, -1)
            assert len({tuple(x.tolist()) for x in per_env}) == 4, key


def test_another_seed_gives_other_data_and_the_same_seed_the_same(client, tmp_path,
                                                                  cartpole_policy):
    a, _ = _collect(client, str(tmp_path / "a"), cartpole_policy, seed=3, total_frames=160)
    b, _ = _collect(client, str(tmp_path / "b"), cartpole_policy, seed=4, total_frames=160)
    c, _ = _collect(client, str(tmp_path / "c"), cartpole_policy, seed=3, total_frames=160)
    for x, y, z in zip(a, b, c):
        assert not torch.equal(x["observation"], y["observation"])
        for k in x:
            assert torch.equal(x[k], z[k]), k


def test_a_second_run_into_the_same_store_gets_new_batch_ids_and_new_data(
        client, tmp_path, cartpole_policy):
    # Documented: reproducing a run needs a fresh store, since batch ids (run * 10**9 + i)
    # seed the policy's sampling and number the episodes.
    url = str(tmp_path / "s")
    first, _ = _collect(client, url, cartpole_policy, seed=3, total_frames=160)
    again, h2 = _collect(client, url, cartpole_policy, seed=3, total_frames=160)
    assert [h.batch_id for h in h2] == [10**9, 10**9 + 1]
    assert all(torch.equal(x["observation"][0], y["observation"][0])  # same env seeds ...
               for x, y in zip(first, again))
    assert not all(torch.equal(x["action"], y["action"])  # ... other policy samples
                   for x, y in zip(first, again))
