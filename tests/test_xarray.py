"""xarray and dask open batches a real Collector wrote (Pendulum: arrays of different trailing
sizes; CartPole: discrete actions), with xarray alone (``open_zarr`` on a ``ZipStore``) and
through daskrl's view (``daskrl.data.batch_to_xarray(handle)``, ``daskrl.data.to_xarray(store)``), computed on the cluster;
every value equals ``handle.load()``'s."""

from __future__ import annotations

import dask.array
import gymnasium as gym
import numpy as np
import pytest
import xarray as xr
from zarr.storage import ZipStore

import daskrl
import daskrl.data
from daskrl.policies import MLPPolicy

pytestmark = pytest.mark.timeout(300)

ENVS = {"Pendulum-v1": {"observation_0": 3, "action_0": 1},
        "CartPole-v1": {"observation_0": 4}}


@pytest.mark.parametrize("env_id", sorted(ENVS))
def test_xarray_opens_batches_a_collector_wrote(tmp_path, client, env_id):
    env = gym.make(env_id)
    policy = MLPPolicy(env.observation_space, env.action_space)
    url = str(tmp_path / "store")
    with daskrl.Collector(env_id, policy, url, client=client, envs_per_worker=3,
                          frames_per_batch=96, total_frames=384) as collector:
        handles = list(collector)
        ds0 = daskrl.data.batch_to_xarray(handles[0])  # through the collector's store
    assert len(handles) == 4
    store = daskrl.open_store(url)
    loaded = {h.batch_id: {k: v.numpy() for k, v in h.load().items()} for h in handles}
    names = sorted(loaded[handles[0].batch_id])
    assert "log_prob" in names and "next_observation" in names

    for h in handles:
        want = loaded[h.batch_id]
        T, E = h.shape
        # xarray alone: the container is a zarr v3 group; every dimension has a name
        with ZipStore(tmp_path / "store" / h.path, mode="r") as zs:
            raw = xr.open_zarr(zs, consolidated=False)
            assert dict(raw.sizes) == {"time": T, "env": E, **ENVS[env_id],
                                       "next_observation_0": ENVS[env_id]["observation_0"]}
            assert sorted(raw.data_vars) == names
            assert raw.attrs["batch_id"] == h.batch_id
            for k in names:
                assert isinstance(raw[k].data, dask.array.Array)
                np.testing.assert_array_equal(raw[k].values, want[k], err_msg=k)
                assert raw[k].dtype == want[k].dtype
        # daskrl's view: lazy, read through the checked reader when computed
        ds = daskrl.data.batch_to_xarray(h, store=store)
        assert ds.attrs["batch_id"] == h.batch_id
        assert ds.attrs["weights_version"] == h.weights_version
        assert ds["observation"].dims == ("time", "env", "observation_0")
        got = client.compute(ds).result()  # on the cluster's workers
        for k in names:
            assert isinstance(ds[k].data, dask.array.Array)
            np.testing.assert_array_equal(got[k].values, want[k], err_msg=k)
    np.testing.assert_array_equal(ds0["reward"].values, loaded[handles[0].batch_id]["reward"])

    # the whole store, flattened to frames, in batch-id order; which batch each frame came from
    ids = sorted(loaded)
    full = daskrl.data.to_xarray(store)
    assert full.sizes["frame"] == 384
    np.testing.assert_array_equal(
        full["batch_id"].values, np.concatenate([np.full(96, b) for b in ids]))
    for k in names:
        want = np.concatenate([loaded[b][k].reshape(-1, *loaded[b][k].shape[2:]) for b in ids])
        np.testing.assert_array_equal(full[k].values, want, err_msg=k)
    one = full.isel(frame=(full["batch_id"] == ids[1]).values)  # lazy coordinate: compute it
    np.testing.assert_array_equal(one["step"].values, loaded[ids[1]]["step"].reshape(-1))
    # along time: the same E in every batch
    by_time = daskrl.data.to_xarray(store, ["reward", "episode_id"], layout="time")
    T = handles[0].shape[0]
    assert by_time.sizes == {"time": 4 * T, "env": 3}
    np.testing.assert_array_equal(
        by_time["reward"].values, np.concatenate([loaded[b]["reward"] for b in ids]))
