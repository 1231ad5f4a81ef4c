"""Write ``store-2.2`` and ``store-2.2-episode-ids.json`` (used by ``tests/test_run_numbers.py``)
with the daskrl on ``PYTHONPATH``: they were made with daskrl at commit 7828095 (format 2.2),
the last before runs past 549, by

    git archive 7828095 daskrl | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old python tests/data/make_store_2_2.py tests/data
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from distributed import Client, LocalCluster

import daskrl
from daskrl.testing import TagPolicy


def main(out: Path) -> None:
    url = str(out / "store-2.2")
    with (LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                       dashboard_address=None, silence_logs=logging.ERROR) as cluster,
          Client(cluster, set_as_default=False) as client):
        for total in (12, 8):  # runs 0 and 1
            with daskrl.Collector("daskrl.testing:Counting-v0", TagPolicy(), url, client=client,
                                  envs_per_worker=2, frames_per_batch=4, total_frames=total,
                                  num_workers=1, env_kwargs={"length": 3},
                                  compression="none") as c:
                list(c)
    store = daskrl.open_store(url)
    ids = {str(b): store.load(b, keys=["episode_id"])["episode_id"].numpy().tolist()
           for b in store.batch_ids()}
    (out / "store-2.2-episode-ids.json").write_text(json.dumps(ids, indent=0) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
