"""A scheduler plugin for fault tests: SIGKILL a worker at a chosen moment of a batch."""

from __future__ import annotations

import os
import signal

from distributed import SchedulerPlugin


class KillOnResult(SchedulerPlugin):
    """SIGKILLs the worker the moment the scheduler learns it finished the task whose (first)
    batch is ``batch_id``: its batches are committed, their handles not yet with the learner.
    The worker's nanny is told not to start a replacement (a machine that does not return)."""

    def __init__(self, cluster, batch_id: int) -> None:
        self.cluster, self.suffix, self.killed = cluster, f"-{batch_id}", None

    def transition(self, key, start, finish, *args, **kwargs):
        if (self.killed is None and finish == "memory" and str(key).startswith("daskrl-collect-")
                and str(key).endswith(self.suffix)):
            from distributed.core import Status

            address = kwargs["worker"]
            for nanny in self.cluster.workers.values():
                if nanny.worker_address == address:
                    nanny.status = Status.closing_gracefully  # close, do not restart
            os.kill(self.cluster.scheduler.workers[address].pid, signal.SIGKILL)
            self.killed = address
