"""Resuming a collection (``resume=``): which run a collector continues, whether its settings
agree with that run's, and how many frames of ``total_frames`` are committed already.

Bookkeeping over the store's run and commit records only, on the learner, before any worker
starts: a resumed run is a new run of the store (new run number, new batch ids) whose record
names the run it continues (``resumes``); the frames committed by that run and by the runs it
continued in turn (its *chain*) count toward ``total_frames``. See
``docs/integrations/resume.md``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from daskrl.config import CollectorConfig
from daskrl.errors import ResumeError, ResumeMismatchError
from daskrl.store._layout import run_key, run_of
from daskrl.store._store import TrajectoryStore

__all__ = ["MUST_AGREE", "Resume", "check_settings", "count_frames", "find_resume", "plan_resume",
           "run_settings"]

logger = logging.getLogger(__name__)

MUST_AGREE = ("env", "observation_space", "action_space", "envs_per_worker", "frames_per_batch",
              "total_frames", "max_frames_per_traj", "init_random_frames", "reset_at_each_iter",
              "seed", "wrappers", "info_keys", "vectorization_mode", "vector_kwargs",
              "store_policy_state")
"""Settings a resumed run must share with the run it resumes: they shape the data (what a
batch holds, how long it is, how episodes end, what the frame budget is, where the seeds come
from). The others (``num_workers``, ``rounds`` (``sync`` in older records), ``compression``,
timeouts, ...) may change."""


@dataclasses.dataclass(frozen=True)
class Resume:
    """What a resumed collection continues."""

    run: int
    """The run it resumes (its record's ``resumes``)."""
    chain: tuple[int, ...]
    """The runs whose committed frames count toward ``total_frames``: ``run`` and the runs it
    resumed in turn, oldest first."""
    frames: int
    """Frames those runs had committed when the collector counted them (as it started)."""
    total_frames: int | None
    """The collection's ``total_frames`` (None: until closed)."""

    @property
    def frames_left(self) -> int | None:
        """Frames still to collect (0 when the collection is complete; None: no limit)."""
        return None if self.total_frames is None else max(0, self.total_frames - self.frames)

    @property
    def complete(self) -> bool:
        """Whether nothing is left to collect."""
        return self.frames_left == 0


def run_settings(env_label: str | Sequence[str], observation_space: Any, action_space: Any,
                 cfg: CollectorConfig) -> dict[str, Any]:
    """The ``settings`` of a run's record: the env (its label; with several envs, the list of
    labels), ``envs`` (the labels by env index, always a list), their spaces (as their
    ``repr``) and the config's stored fields (``resume`` is not one: the record's ``resumes``
    says it)."""
    labels = [env_label] if isinstance(env_label, str) else list(env_label)
    stored = {k: v for k, v in cfg.as_dict().items() if k != "resume"}
    return {"env": labels[0] if len(labels) == 1 else labels, "envs": labels,
            "observation_space": repr(observation_space),
            "action_space": repr(action_space), **stored}


def count_frames(store: TrajectoryStore, chain: tuple[int, ...]) -> int:
    """Frames committed now by the batches of the runs in ``chain``."""
    runs = set(chain)
    return sum(int(rec["frames"]) for bid, rec in store.records().items() if run_of(bid) in runs)


def check_settings(run: int, stored: Mapping[str, Any], settings: Mapping[str, Any],
                   url: str) -> None:
    """Raise :class:`ResumeMismatchError` naming the first of :data:`MUST_AGREE` on which run
    ``run``'s ``stored`` settings and this collector's differ (a setting an older record lacks
    is not checked)."""
    for key in MUST_AGREE:
        if key not in stored or key not in settings or stored[key] == settings[key]:
            continue
        if key == "env" or key.endswith("_space"):
            todo = "resume it with the run's env (and env_kwargs)"
        else:
            todo = f"pass {key}={stored[key]!r}"
        raise ResumeMismatchError(
            f"cannot resume run {run} of store {url!r}: {key} differs (run {run}: "
            f"{stored[key]!r}, this collector: {settings[key]!r}). A resumed collection "
            f"continues the run's data with the run's settings: {todo}, or collect into a new "
            f"store (store.runs()[{run}]['settings'] lists the run's settings).",
            field=key)


def find_resume(store: TrajectoryStore, resume: bool | int,
                settings: Mapping[str, Any]) -> tuple[int, tuple[int, ...]] | None:
    """The run ``resume`` names in ``store`` (``True``: the latest) and the runs of its chain
    (``(run, chain)``), its settings checked against this collector's ``settings``; None for
    ``resume=False``, and for ``resume=True`` on a store with no run (a new collection).
    Nothing is counted or logged: the CLI calls it before any cluster starts.

    Raises :class:`ResumeError` for a run that is not in the store, cannot be read, or was
    resumed by another run already; :class:`ResumeMismatchError` for a setting that differs.
    """
    if resume is False:
        return None
    url = store.url
    runs = store.runs()
    newest = store.next_run() - 1  # the newest run number listed, readable or not
    if resume is True:
        if newest < 0:
            return None
        target = newest
    else:
        target = int(resume)
    if target not in runs:
        if 0 <= target <= newest:
            why = store.skipped_records().get(run_key(target), "it is missing")
            raise ResumeError(
                f"cannot resume run {target} of store {url!r}: its run record cannot be read "
                f"({why}). Resume another run (resume=<run number>) or collect into a new "
                "store.")
        have = ", ".join(str(r) for r in sorted(runs)) or "none"
        raise ResumeError(
            f"cannot resume run {target} of store {url!r}: the store has no run {target} (its "
            f"runs: {have}). resume=True continues the latest run.")
    resumed_by = sorted(r for r, rec in runs.items() if rec.get("resumes") == target)
    if resumed_by:
        raise ResumeError(
            f"cannot resume run {target} of store {url!r}: run {resumed_by[0]} resumed it "
            f"already, and resuming it again would collect its missing frames twice. Resume "
            f"the newest run of that collection instead (resume=True resumes run {newest}).")
    chain = [target]
    while (earlier := runs[chain[-1]].get("resumes")) is not None:
        if earlier not in runs:
            raise ResumeError(
                f"cannot resume run {target} of store {url!r}: it continues run {earlier}, "
                "whose run record cannot be read, so the frames committed toward total_frames "
                "are not known. Collect into a new store.")
        chain.append(earlier)
    check_settings(target, runs[target].get("settings", {}), settings, url)
    return target, tuple(sorted(chain))


def plan_resume(store: TrajectoryStore, resume: bool | int,
                settings: Mapping[str, Any]) -> Resume | None:
    """:func:`find_resume`, with the chain's committed frames counted; ``resume=True`` on a
    store with no run is logged as a new collection."""
    found = find_resume(store, resume, settings)
    if found is None:
        if resume is True:
            logger.warning("store %r holds no run to resume: starting a new collection",
                           store.url)
        return None
    target, chain = found
    return Resume(target, chain, count_frames(store, chain), settings.get("total_frames"))
