"""A store's runs past the 550 that format 2.2 could number, collected for real on an
in-process cluster: the last run a store can have, and a store written by daskrl's format 2.2
(``tests/data/store-2.2``, made by ``tests/data/make_store_2_2.py`` with the daskrl before
this packing) continued past run 549, its own ids unchanged."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import daskrl
from daskrl import StoreError
from daskrl.data import episodes as iter_store_episodes
from daskrl.store._layout import (
    EXTENDED_FIRST_RUN,
    MAX_RUNS,
    UNUSED_EPISODE_IDS,
    batches_per_run,
    episode_origin,
    run_first_batch,
    run_of,
)
from daskrl.testing import TagPolicy, check_episode_continuity

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

DATA = Path(__file__).parent / "data"
OPTIONS = {"envs_per_worker": 2, "frames_per_batch": 4, "num_workers": 1,
           "env_kwargs": {"length": 3}}


def _collect(url: str, client, total: int) -> list[daskrl.BatchHandle]:
    with daskrl.Collector("daskrl.testing:Counting-v0", TagPolicy(), url, client=client,
                          total_frames=total, **OPTIONS) as c:
        return list(c)


def _add_run_record(url: str, run: int) -> None:
    """A record for run ``run`` (a copy of run 0's), as if the runs before it had been."""
    src = Path(url) / "runs" / "0000" / "zarr.json"
    doc = json.loads(src.read_text())
    doc["attributes"]["run"] = run
    (Path(url) / "runs" / f"{run:04d}").mkdir()
    (Path(url) / "runs" / f"{run:04d}" / "zarr.json").write_text(json.dumps(doc))


def _format_version(url: str | Path) -> str:
    return json.loads((Path(url) / "zarr.json").read_text())["attributes"]["daskrl"][
        "format_version"]


def _episode_ids(store, batch_ids) -> dict[int, np.ndarray]:
    return {b: store.load(b, keys=["episode_id"])["episode_id"].numpy() for b in batch_ids}


def _check_run(store, run: int, frames: int) -> set[int]:
    """``run``'s batches are numbered in its range and its episodes start where their ids say;
    returns its episode ids."""
    ids = [b for b in store.batch_ids() if run_of(b) == run]
    first = run_first_batch(run)
    assert ids and all(first <= b < first + batches_per_run(run) for b in ids)
    assert sum(store.records()[b]["frames"] for b in ids) == frames
    episodes = set()
    for b, eid in _episode_ids(store, ids).items():
        step = store.load(b, keys=["step"])["step"].numpy()
        for t, e in np.argwhere(step == 0).tolist():
            origin, k = episode_origin(int(eid[t, e]))
            # it starts in this batch at row t, or at the end of its stream's batch before
            assert (origin, k) == (b, t * 2 + e) or (t == 0 and origin < b and run_of(origin) == run)
        episodes |= set(eid.ravel().tolist())
    assert all((eid >= 0) == (run < EXTENDED_FIRST_RUN) for eid in episodes)
    return episodes


def test_the_last_run_a_store_can_have_collects_unique_episode_ids(tmp_path, inproc_client):
    url = str(tmp_path / "s")
    _collect(url, inproc_client, 4)
    _add_run_record(url, MAX_RUNS - 2)
    handles = _collect(url, inproc_client, 24)
    store = daskrl.open_store(url)
    last = MAX_RUNS - 1
    assert sorted(store.runs()) == [0, MAX_RUNS - 2, last]
    assert [run_of(h.batch_id) for h in handles] == [last] * 6
    ids = _check_run(store, last, 24)
    assert all(i < UNUSED_EPISODE_IDS.start for i in ids)
    assert len(ids) == 8  # 12 steps of each of 2 envs: 4 episodes of 3 steps each
    episodes = list(iter_store_episodes(store, complete_only=False))
    assert len({ep.episode_id for ep in episodes}) == len(episodes)
    assert {ep.episode_id for ep in episodes if run_of(ep.batch_ids[0]) == last} == ids
    assert check_episode_continuity(store).transitions == 28
    with pytest.raises(StoreError, match=re.escape(
            "has used all 66_086 run numbers a store can have (its newest run is 66085")):
        _collect(url, inproc_client, 4)


def test_a_2_2_store_reads_its_episode_ids_unchanged(tmp_path):
    """``tests/data/store-2.2``: two runs (12 and 8 frames, ``[T=2, E=2]`` batches, episodes
    of 3 steps) collected by daskrl at format 2.2, with the ids it wrote."""
    store = daskrl.open_store(str(DATA / "store-2.2"))
    assert _format_version(DATA / "store-2.2") == "2.2"
    want = {int(b): np.array(v) for b, v in
            json.loads((DATA / "store-2.2-episode-ids.json").read_text()).items()}
    got = _episode_ids(store, store.batch_ids())
    assert sorted(got) == sorted(want) == [0, 1, 2, 1_000_000_000, 1_000_000_001]
    for b in want:
        assert np.array_equal(got[b], want[b])
        assert all(episode_origin(i) == divmod(i, 2**24) for i in got[b].ravel().tolist())
    assert check_episode_continuity(store).transitions == 20


def test_a_2_2_store_goes_on_past_run_549(tmp_path, inproc_client):
    url = str(tmp_path / "s")
    shutil.copytree(DATA / "store-2.2", url)
    before = _episode_ids(daskrl.open_store(url), daskrl.open_store(url).batch_ids())
    _collect(url, inproc_client, 8)  # run 2: format 2.2's ids
    _add_run_record(url, EXTENDED_FIRST_RUN - 1)
    _collect(url, inproc_client, 8)  # run 550: extended ids
    store = daskrl.open_store(url)
    assert _format_version(url) == "2.2"  # the store's own: it was created at 2.2
    assert sorted(store.runs()) == [0, 1, 2, 549, 550]
    assert all(np.array_equal(a, before[b]) for b, a in _episode_ids(store, before).items())
    ids = [_check_run(store, run, 8) for run in (1, 2, 550)]
    assert not (ids[0] & ids[1]) and not (ids[1] & ids[2]) and not (ids[0] & ids[2])
    assert check_episode_continuity(store).transitions == 36
