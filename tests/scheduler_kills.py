"""A worker plugin for fault tests: SIGKILL a worker at a chosen moment of a batch."""

from __future__ import annotations

import os
import signal

from distributed import WorkerPlugin


class KillAfterCommit(WorkerPlugin):
    """SIGKILLs its worker's process right after the worker commits batch ``batch_id``, once
    (the file ``flag`` says it happened, and holds the worker's address): the batch is in the
    store, its handle never leaves the worker. (A nanny starts a new worker process, at a new
    address.)"""

    def __init__(self, batch_id: int, flag: str) -> None:
        self.batch_id, self.flag = batch_id, flag

    def setup(self, worker) -> None:
        from daskrl.store._store import TrajectoryStore

        original = TrajectoryStore.write_batch
        batch_id, flag = self.batch_id, self.flag

        def write_batch(store, bid, *args, **kwargs):
            result = original(store, bid, *args, **kwargs)
            if bid == batch_id and result[1] and not os.path.exists(flag):
                with open(flag, "w") as f:
                    f.write(worker.address)
                os.kill(os.getpid(), signal.SIGKILL)
            return result

        TrajectoryStore.write_batch = write_batch  # in this worker's process only
