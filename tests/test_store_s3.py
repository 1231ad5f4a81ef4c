"""The store on a real S3-protocol server (moto's server mode on loopback) through s3fs."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

import daskrl
import daskrl.data
from daskrl.store import TrajectoryStore
from daskrl.testing import TagPolicy

sys.path.insert(0, str(Path(__file__).parent))
from store_writer_proc import batch_arrays, meta

SCRIPT = str(Path(__file__).parent / "store_writer_proc.py")
KEY, SECRET = "daskrl-test-key-id", "daskrl-test-SECRET-value"
BUCKET = "daskrl-test"


@pytest.fixture(scope="module")
def s3_endpoint():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        import boto3

        # boto3, not s3fs: s3fs sends a LocationConstraint that us-east-1 rejects.
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY,
                     aws_secret_access_key=SECRET, region_name="us-east-1"
                     ).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        server.stop()


@pytest.fixture
def s3(s3_endpoint):
    """``(url, storage_options)`` of a fresh store prefix in the bucket."""
    options = {"endpoint_url": s3_endpoint, "key": KEY, "secret": SECRET,
               "client_kwargs": {"region_name": "us-east-1"}}
    return f"s3://{BUCKET}/{uuid.uuid4().hex}", options


def test_write_read_and_handles_without_credentials(s3):
    url, options = s3
    w = TrajectoryStore(url, options, read_only=False)
    w.initialize()
    path, committed = w.write_batch(3, batch_arrays(3, 1), meta(1))
    assert committed and w.write_batch(3, batch_arrays(3, 2), meta(2))[1] is False
    store = daskrl.open_store(url, options)
    assert store.batch_ids() == [3] and store.handle(3).path == path
    got = store.load(3)
    for k, v in batch_arrays(3, 1).items():
        np.testing.assert_array_equal(got[k].numpy(), v)
    handle = store.handle(3)
    data = pickle.dumps(handle)
    assert KEY.encode() not in data and SECRET.encode() not in data and b"secret" not in data
    assert "key" not in json.dumps(handle.record())
    np.testing.assert_array_equal(handle.load(keys=["reward"], store=store)["reward"].numpy(),
                                  batch_arrays(3, 1)["reward"])
    # only the loser's attempt was removed
    import s3fs

    fs = s3fs.S3FileSystem(**{k: v for k, v in options.items() if k != "endpoint_url"},
                           endpoint_url=options["endpoint_url"])
    assert [p.rsplit("/", 1)[1] for p in fs.ls(f"{url[5:]}/batches")
            if not p.endswith("zarr.json")] == [path.split("/")[1]]
    assert path.endswith(".zip") and fs.info(f"{url[5:]}/{path}")["type"] == "file"
    # a batch larger than the reader's first (suffix) request: its chunks come by range requests
    big = batch_arrays(4, 3, width=8192)  # 4 MiB of observations, one chunk
    w.write_batch(4, big, meta(3), compression="none")
    got = store.load(4)
    for k, v in big.items():
        np.testing.assert_array_equal(got[k].numpy(), v)
    assert set(store.load(4, keys=["reward"])) == {"reward"}
    # zarr alone reads a container in place through fsspec's zip:: chaining (docs/store-format.md)
    import zarr

    root = zarr.open_group(url, mode="r", storage_options=options)
    assert root.attrs["daskrl"]["format_version"] == "2.3"
    group = zarr.open_group(f"zip::{url}/{path}", mode="r", storage_options={"s3": options})
    assert group.attrs["batch_id"] == 3
    np.testing.assert_array_equal(group["observation"][...], batch_arrays(3, 1)["observation"])


def test_processes_race_on_s3_and_a_polling_reader_sees_new_batches(s3, tmp_path):
    url, options = s3
    w = TrajectoryStore(url, options, read_only=False)
    w.initialize()
    reader = daskrl.open_store(url, options)
    assert reader.batch_ids() == []  # s3fs has now cached an empty listing
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, SCRIPT, "write", url, str(tag), "0", "4", str(go),
                               json.dumps(options)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for tag in (1, 2)]
    time.sleep(0.5)
    go.touch()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        outs.append({int(line.split()[0]) for line in out.splitlines() if line.endswith(" 1")})
    assert outs[0] | outs[1] == {0, 1, 2, 3} and not outs[0] & outs[1]  # exactly one commit each
    assert reader.batch_ids() == [0, 1, 2, 3]  # refresh() invalidated s3fs's listing cache
    for bid in range(4):
        tag = int(reader.records()[bid]["weights_version"])
        assert tag == (1 if bid in outs[0] else 2)
        got = reader.load(bid)
        for k, v in batch_arrays(bid, tag).items():
            np.testing.assert_array_equal(got[k].numpy(), v)


@pytest.mark.system
def test_collector_on_s3_then_readers_and_housekeeping(s3, inproc_client):
    url, options = s3
    with daskrl.Collector("daskrl.testing:Counting-v0", TagPolicy(), url,
                          storage_options=options, client=inproc_client, envs_per_worker=2,
                          frames_per_batch=12, total_frames=48) as c:
        handles = list(c)
    assert all(KEY not in repr(h) and SECRET not in repr(h) for h in handles)
    store = daskrl.open_store(url, options)
    assert len(store) == 4 and store.frames == 48
    batch = store.load(handles[0].batch_id)
    np.testing.assert_array_equal(batch["next_observation"].numpy() - batch["observation"].numpy(),
                                  np.broadcast_to([0.0, 1.0], (6, 2, 2)))
    eps = list(daskrl.data.episodes(store, ["reward"]))  # CountingEnv: episodes of 5 steps, rewards 1..5
    assert eps and all(e.length == 5 and e.total_reward == 15.0 for e in eps)
    frames = daskrl.data.to_dask(store, ["reward"])["reward"]
    assert frames.shape == (48,) and float(frames.sum().compute()) == float(
        sum(store.load(b)["reward"].sum() for b in store.batch_ids()))
    # a replay buffer on S3, loaded by two DataLoader worker processes (forked from this
    # process and its threads: one stuck at the fork fails the test in 120 s, not hangs it)
    from torch.utils.data import DataLoader

    replay = daskrl.ReplayDataset(url, ["observation", "next_observation"], samples_per_batch=4,
                                  num_samples=16, storage_options=options)
    got = list(DataLoader(replay, batch_size=4, num_workers=2, timeout=120))
    assert len(got) == 4
    for b in got:
        np.testing.assert_array_equal((b["next_observation"] - b["observation"]).numpy(),
                                      np.broadcast_to([0.0, 1.0], (4, 2)))
    # housekeeping on S3: keep the newest two, and collect an abandoned attempt
    writable = daskrl.open_store(url, options, writable=True)
    ids = store.batch_ids()
    assert writable.keep_last(2) == ids[:2] and store.batch_ids() == ids[2:]
    import s3fs

    fs = s3fs.S3FileSystem(**{k: v for k, v in options.items() if k != "endpoint_url"},
                           endpoint_url=options["endpoint_url"])
    dead = f"{url[5:]}/batches/{ids[-1] + 1:012d}-deadbeef0000.zip"
    foreign = f"{url[5:]}/batches/{ids[-1] + 2:012d}-deadbeef0000/zarr.json"  # not a container
    fs.pipe_file(dead, b"PK\x05\x06" + bytes(18))
    fs.pipe_file(foreign, b"{}")
    garbage = (dead.split("/", 2)[2],)
    assert writable.collect_garbage(older_than=3600).kept == garbage
    report = writable.collect_garbage(older_than=0)
    assert report.attempts == garbage and report.bytes == 22
    assert fs.cat_file(foreign) == b"{}"
    assert store.batch_ids() == ids[2:] and store.load(ids[-1])["reward"].shape == (6, 2)


@pytest.mark.timeout(120)
def test_weights_in_store_on_s3_reach_process_workers(s3, client):
    """``weights_in_store`` on an object store: each version one object, read by ranges."""
    import s3fs
    import torch

    url, options = s3
    policy = TagPolicy()
    handles = []
    with daskrl.Collector("daskrl.testing:Counting-v0", policy, url, storage_options=options,
                          client=client, envs_per_worker=2, frames_per_batch=12,
                          total_frames=72, weights_in_store=True) as c:
        for handle in c:
            handles.append(handle)
            with torch.no_grad():
                policy.tag.fill_(c.weights_version + 1)
            c.update_weights(policy)
        name = c.plugin_name
        sources = client.run(lambda dask_worker: dask_worker.plugins[name].weight_sources)
        assert not client.list_datasets()
        weights_prefix = f"{url[5:]}/runs/weights-{c._id}"
    assert {s for loaded in sources.values() for _, s in loaded} >= {"store"}
    store = daskrl.open_store(url, options)
    assert store.frames == 72
    for h in handles:
        assert (store.load(h.batch_id, keys=["tag"])["tag"] == h.weights_version).all()
    assert len({h.weights_version for h in handles}) >= 3
    fs = s3fs.S3FileSystem(**{k: v for k, v in options.items() if k != "endpoint_url"},
                           endpoint_url=options["endpoint_url"])
    fs.invalidate_cache()
    assert not fs.exists(weights_prefix) or not fs.find(weights_prefix)  # removed at close


def test_two_differently_configured_stores_of_one_url_each_read_with_their_own_options(s3):
    """The same URL on two S3 endpoints (two servers, one bucket name): each store object, its
    handles and its datasets read with that store's own options. A process-wide map from URL to
    options (last writer wins) read the first store's handles from the second endpoint."""
    import boto3

    url, first = s3
    # A second server in its own process (moto's servers in one process share their buckets).
    server = subprocess.Popen(
        [sys.executable, "-c", "from moto.server import ThreadedMotoServer; import sys, time; "
         "s = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False); s.start(); "
         "print(s.get_host_and_port()[1], flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        second = {**first, "endpoint_url": f"http://127.0.0.1:{port}"}
        boto3.client("s3", endpoint_url=second["endpoint_url"], aws_access_key_id=KEY,
                     aws_secret_access_key=SECRET, region_name="us-east-1"
                     ).create_bucket(Bucket=BUCKET)
        stores = {}
        for tag, options in ((1, first), (2, second)):
            w = TrajectoryStore(url, options, read_only=False)
            w.initialize()
            assert w.write_batch(0, batch_arrays(0, tag), meta(tag))[1]
            stores[tag] = daskrl.open_store(url, options)  # the second opened last
        for tag, store in stores.items():
            handle = store.handle(0)
            assert handle.weights_version == tag and handle.needs_options
            want = batch_arrays(0, tag)["observation"]
            for got in (handle.load(), handle.load(store=store), store.load(handle),
                        pickle.loads(pickle.dumps(handle)).load(store=store)):
                np.testing.assert_array_equal(got["observation"].numpy(), want)
            with pytest.raises(daskrl.StoreOptionsRequiredError, match="store="):
                pickle.loads(pickle.dumps(handle)).load()
            item = daskrl.TransitionDataset(store, ["observation"])[0]
            np.testing.assert_array_equal(item["observation"].numpy(), want[0, 0])
            by_url = daskrl.TransitionDataset(url, ["observation"], storage_options=store.storage_options)
            np.testing.assert_array_equal(by_url[0]["observation"].numpy(), want[0, 0])
    finally:
        server.kill()
        server.wait(timeout=60)
