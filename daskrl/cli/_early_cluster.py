"""``daskrl collect``'s embedded cluster, started in a thread as soon as the command's input is
checked, so that its worker processes import torch and daskrl while the learner imports torch
and builds the policy (each alone takes seconds; one after the other, most of the start-up).
The workers' forkserver (:mod:`daskrl.deploy._forkserver`) starts first, from the command's
thread, so that its imports also overlap the scheduler's start."""

from __future__ import annotations

import threading
from typing import Any

from daskrl.deploy._connect import Deployment

__all__ = ["EarlyCluster"]


class EarlyCluster:
    """``daskrl.deploy.local_cluster(**options)``, starting in a background thread.

    :meth:`deployment` waits for it (and raises what its start raised); :meth:`close` waits and
    closes it, for a command that fails before it collects.
    """

    def __init__(self, **options: Any) -> None:
        self._cluster: Any = None
        self._error: BaseException | None = None
        if options.get("processes", True):
            from daskrl.deploy import _forkserver

            _forkserver.prestart()  # before any other thread runs: it sets env vars briefly
        self._thread = threading.Thread(target=self._start, args=(options,),
                                        name="daskrl-embedded-cluster", daemon=True)
        self._thread.start()

    def _start(self, options: dict[str, Any]) -> None:
        from daskrl.deploy._cluster import local_cluster

        try:
            self._cluster = local_cluster(**options)
        except BaseException as e:  # re-raised in the command's thread
            self._error = e
            from daskrl.deploy import _forkserver

            _forkserver.stop_if_idle()  # no nanny is left to stop it

    def deployment(self) -> Deployment:
        """The started cluster and a client of it (closed with :meth:`Deployment.close`)."""
        from distributed import Client

        self._thread.join()
        if self._error is not None:
            raise self._error
        try:
            return Deployment(Client(self._cluster, set_as_default=False), self._cluster)
        except BaseException:
            self._cluster.close()
            raise

    def close(self) -> None:
        """Wait for the start, then close the cluster (nothing when its start failed)."""
        self._thread.join()
        if self._cluster is not None:
            self._cluster.close()
