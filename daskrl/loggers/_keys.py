"""The names of the metrics a collector logs (cleanrl's where cleanrl has one), and what each
means; the table in ``docs/integrations/logging.md`` lists the same keys."""

from __future__ import annotations

import re

__all__ = ["EPISODIC_LENGTH", "EPISODIC_RETURN", "METRIC_KEYS", "worker_key"]

EPISODIC_RETURN = "charts/episodic_return"
EPISODIC_LENGTH = "charts/episodic_length"

METRIC_KEYS: dict[str, str] = {
    EPISODIC_RETURN: "return of one finished episode (one value per episode)",
    EPISODIC_LENGTH: "length of one finished episode, in steps (one value per episode)",
    "charts/SPS": "frames handed over per second since the collection started",
    "collector/batches": "batches handed over so far",
    "collector/episodes": "episodes finished so far, in the batches handed over",
    "collector/policy_lag": "this batch's policy lag (newest weights version minus the batch's)",
    "collector/policy_lag_mean": "mean policy lag of the batches handed over so far",
    "collector/weights_version": "the learner's newest published weights version",
    "collector/batch_weights_version": "the weights version this batch was collected with",
    "collector/dropped_stale": "batches dropped so far as older than max_policy_lag",
    "collector/in_flight": "batches submitted and not yet handed over",
    "collector/store_bytes": "bytes in the store of the batches handed over so far",
    "workers/{worker}/fps": "this worker's frames handed over per second since the start",
    "workers/{worker}/rollout_fps": "this worker's frames per second while stepping envs and "
                                    "the policy (store writes excluded)",
}
"""Every key a collector logs, and what it means. ``{worker}`` is the worker's address without
its scheme (``127.0.0.1:40123``). The step of every value is the number of frames handed over
to the learner so far, counting the batch it comes from."""

_UNSAFE = re.compile(r"[^\w.:-]")


def worker_key(address: str, name: str) -> str:
    """``workers/<host:port>/<name>`` for a worker address such as ``tls://10.0.0.5:40123``
    (characters other than letters, digits, ``_.:-`` become ``_``, so MLflow accepts it)."""
    host = address.split("://", 1)[-1]
    return f"workers/{_UNSAFE.sub('_', host)}/{name}"
