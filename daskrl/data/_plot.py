"""A store as a picture: episode returns against the frame where each episode ended, one
colour per run, over a panel of frames/s per worker (``daskrl inspect --plot PNG``).

Frames are counted per run. An episode's **end frame** is the number of frames its run had
collected when it ended: the frames of the run's batches with lower ids (a resumed run starts
where the run it resumes ended, so a collection resumed after a crash reads as one curve), plus ``(t + 1) * E``
for an episode that ended at step ``t`` of its batch of ``E`` envs (the envs of a batch step
together, so step ``t`` completes ``(t + 1) * E`` of the batch's frames). A batch whose first
frame is ``F`` places its episodes in ``(F, F + T * E]``. Batches count in id order, the order
the learner planned them in (collected in that order up to the batches in flight at once).

The step each episode ended at is read from the batch's ``terminated`` and ``truncated`` arrays
(two small boolean arrays per batch); its return is the commit record's. Frames/s per worker
are each batch's ``frames / rollout_seconds`` (stepping envs and policy; store writes excluded),
at the batch's last frame.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from daskrl.errors import ArrayNotFoundError, MissingDependencyError, StoreError
from daskrl.store import run_of

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from daskrl.store import TrajectoryStore

__all__ = ["RunCurve", "plot_figure", "plot_returns", "run_curves"]

RUNNING_MEAN = 100
"""The line of each run is the mean of its last this many episodes."""
READ_THREADS = 8
"""Batches whose done flags are read at once (a remote store answers each read slowly)."""
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


@dataclasses.dataclass(frozen=True)
class RunCurve:
    """What the plot shows of one run (see the module docstring for how frames count)."""

    run: int
    resumes: int | None
    """The run this one resumes (its frames go on from that run's), or None."""
    env: str | None
    """The env of the run's record (None if the record cannot be read)."""
    end_frames: np.ndarray
    """int64 ``[N]``: each episode's end frame, ascending."""
    returns: np.ndarray
    """float64 ``[N]``: each episode's return, in the same order."""
    batch_ranges: dict[int, tuple[int, int]]
    """``{batch id: (frames of the run before it, frames through it)}``: its episodes' end
    frames lie in ``(before, through]``."""
    worker_fps: dict[str, tuple[np.ndarray, np.ndarray]]
    """``{worker: (frames at the end of each of its batches, frames/s of each)}``."""
    unplaced: int
    """Episodes not shown: their batch's arrays could not be read (deleted since listed,
    damaged, no ``terminated``) or do not hold as many episode ends as the commit record."""


def _end_steps(store: TrajectoryStore, bid: int, n_envs: int, n_episodes: int
               ) -> np.ndarray | None:
    """The step index of each episode end of batch ``bid``, in the record's order (step, then
    env), or None if its arrays cannot be read or disagree with the record."""
    if n_episodes == 0:
        return np.zeros(0, np.int64)
    arrays: dict[str, Any] = {}
    # A batch written by other code than a collector may lack ``truncated``.
    for keys in (["terminated", "truncated"], ["terminated"]):
        try:
            arrays = store.load(bid, keys=keys)
            break
        except ArrayNotFoundError:
            continue
        except (StoreError, KeyError):  # deleted since listed (BatchNotFoundError), damaged
            return None
    if not arrays:
        return None
    done = arrays["terminated"].numpy().reshape(-1).copy()
    if "truncated" in arrays:
        done |= arrays["truncated"].numpy().reshape(-1)
    ends = np.flatnonzero(done)  # row-major [T, E]: by step, then env, as the worker appends
    return ends // n_envs if ends.size == n_episodes else None


def run_curves(store: TrajectoryStore) -> dict[int, RunCurve]:
    """The episode ends and worker throughput of each run of ``store``, by run number."""
    records = store.records()
    runs = store.runs()
    bids = list(records)

    def steps_of(bid: int) -> np.ndarray | None:
        rec = records[bid]
        n_envs = int(rec.get("shape", [0, 0])[1]) or 1
        return _end_steps(store, bid, n_envs, len(rec.get("episode_returns") or []))

    with ThreadPoolExecutor(min(READ_THREADS, max(1, len(bids)))) as pool:
        end_steps = dict(zip(bids, pool.map(steps_of, bids)))
    acc: dict[int, dict[str, Any]] = {}
    for bid in bids:  # ascending ids: the run's frames so far
        rec = records[bid]
        run = run_of(bid)
        if run not in acc:  # a resumed run goes on from its earlier run's frames
            resumes = (runs.get(run) or {}).get("resumes")
            start = acc[resumes]["frames"] if resumes in acc else 0
            acc[run] = {"frames": start, "x": [], "y": [], "ranges": {}, "fps": {},
                        "unplaced": 0}
        a = acc[run]
        first, frames = a["frames"], int(rec["frames"])
        n_envs = int(rec.get("shape", [0, 0])[1]) or 1
        a["ranges"][bid] = (first, first + frames)
        a["frames"] += frames
        returns = [float(r) for r in rec.get("episode_returns") or []]
        steps = end_steps[bid]
        if steps is None:
            a["unplaced"] += len(returns)
        else:
            a["x"].extend((first + (steps + 1) * n_envs).tolist())
            a["y"].extend(returns)
        seconds = rec.get("rollout_seconds") or 0
        if seconds > 0:
            xs, ys = a["fps"].setdefault(str(rec["worker"]), ([], []))
            xs.append(first + frames)
            ys.append(frames / seconds)
    out = {}
    for run, a in acc.items():
        x = np.asarray(a["x"], np.int64)
        order = np.argsort(x, kind="stable")
        settings = (runs.get(run) or {}).get("settings") or {}
        out[run] = RunCurve(
            run=run, resumes=(runs.get(run) or {}).get("resumes"), env=settings.get("env"), end_frames=x[order],
            returns=np.asarray(a["y"], np.float64)[order], batch_ranges=a["ranges"],
            worker_fps={w: (np.asarray(xs, np.int64), np.asarray(ys, np.float64))
                        for w, (xs, ys) in sorted(a["fps"].items())},
            unplaced=a["unplaced"])
    return out


def _running_mean(y: np.ndarray, n: int = RUNNING_MEAN) -> np.ndarray:
    """The mean of each value and up to ``n - 1`` before it."""
    c = np.concatenate([[0.0], np.cumsum(y)])
    i = np.arange(1, y.size + 1)
    lo = np.maximum(0, i - n)
    return (c[i] - c[lo]) / (i - lo)


def _colours(n: int) -> list[Any]:
    if n <= 10:
        return [f"C{i}" for i in range(n)]
    from matplotlib import colormaps

    return list(colormaps["turbo"](np.linspace(0.05, 0.95, n)))


def plot_figure(store: TrajectoryStore, title: str | None = None) -> Figure:
    """The figure ``daskrl inspect --plot`` writes (a matplotlib ``Figure``, no pyplot state):
    the top panel has each run's episodes as dots at their end frames and the mean of its last
    100 episodes as a line, in the run's colour; the bottom one, frames/s of each worker of
    each run in the run's colour (one marker per worker)."""
    try:
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
        from matplotlib.ticker import EngFormatter
    except ImportError as e:
        raise MissingDependencyError(
            f"plotting needs matplotlib, which is not installed ({e}). "
            'Install it with: pip install "daskrl[plot]"'
        ) from None
    curves = [c for _, c in sorted(run_curves(store).items())]
    fig = Figure(figsize=(9, 7.5), dpi=110, layout="constrained")
    ax, ax_fps = fig.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    colours = _colours(len(curves))
    fps_lines = sum(len(c.worker_fps) for c in curves)
    for c, colour in zip(curves, colours):
        name = (f"run {c.run}" + (f" ({c.env})" if c.env else "")
                + (f", resumes run {c.resumes}" if c.resumes is not None else ""))
        ax.scatter(c.end_frames, c.returns, s=8, alpha=0.3, color=colour, linewidths=0,
                   gid=f"episodes-run-{c.run}")
        if c.returns.size:
            ax.plot(c.end_frames, _running_mean(c.returns), color=colour, lw=2,
                    gid=f"mean-run-{c.run}",
                    label=f"{name}: {c.returns.size} episodes, mean of the last "
                          f"{RUNNING_MEAN}")
        for i, (worker, (xs, ys)) in enumerate(c.worker_fps.items()):
            label = (f"run {c.run}: {worker}" if fps_lines <= 8 else
                     f"run {c.run}: {len(c.worker_fps)} workers" if i == 0 else None)
            ax_fps.plot(xs, ys, color=colour, lw=1, alpha=0.8, marker=_MARKERS[i % len(_MARKERS)],
                        ms=3, gid=f"fps-run-{c.run}-{worker}", label=label)
    episodes = sum(c.returns.size for c in curves)
    unplaced = sum(c.unplaced for c in curves)
    if episodes:
        handles, labels = ax.get_legend_handles_labels()
        dot = Line2D([], [], ls="", marker="o", ms=4, color="0.5", alpha=0.5)
        ax.legend([*handles, dot], [*labels, "episodes, each at the frame where it ended"],
                  loc="best", fontsize="small")
    else:
        ax.text(0.5, 0.5, "no episode has ended yet", ha="center", va="center",
                transform=ax.transAxes)
    if unplaced:
        ax.text(0.01, 0.01, f"{unplaced} episodes not shown: their batches cannot be read, "
                "or do not hold their ends",
                transform=ax.transAxes, fontsize="small", color="0.4")
    ax.set_ylabel("episode return")
    ax.set_title(title or store.url, fontsize="medium")
    if fps_lines:
        ax_fps.legend(loc="best", fontsize="x-small")
        ax_fps.set_ylim(bottom=0)
    ax_fps.set_ylabel("frames/s per worker\n(stepping; writes excluded)")
    ax_fps.set_xlabel("frames collected in the run")
    ax_fps.xaxis.set_major_formatter(EngFormatter())
    for a in (ax, ax_fps):
        a.grid(alpha=0.3)
    return fig


def plot_returns(store: TrajectoryStore, path: str | Path, title: str | None = None) -> Path:
    """Write :func:`plot_figure`'s figure of ``store`` to ``path`` as a PNG; the path."""
    out = Path(path)
    plot_figure(store, title).savefig(out, format="png")
    return out
