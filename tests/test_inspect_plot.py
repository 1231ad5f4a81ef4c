"""``daskrl inspect --plot``: each episode at the frame where it ended (not its batch's last
frame), one colour per run with a legend, and a panel of frames/s per worker; read back from
the figure's artists and from the PNG the command writes. A store of two real runs of
``CountingEnv`` (episode lengths 3 and 4), whose end frames follow from the env alone."""

from __future__ import annotations

import os
from collections import defaultdict

import matplotlib.image
import numpy as np
import pytest
from matplotlib.colors import to_rgba

import daskrl
from daskrl.cli import main as cli_main
from daskrl.data._plot import plot_figure, plot_returns, run_curves
from daskrl.store._layout import run_of
from daskrl.testing import TagPolicy

pytestmark = pytest.mark.timeout(240)

E, T = 2, 10  # envs per batch, steps per batch
LENGTHS = {0: 3, 1: 4}  # the episode length of each run's envs


@pytest.fixture
def two_runs(tmp_path, inproc_client):
    url = str(tmp_path / "store")
    for run, length in LENGTHS.items():
        with daskrl.Collector("daskrl.testing:Counting-v0", TagPolicy(), url,
                              client=inproc_client, env_kwargs={"length": length},
                              envs_per_worker=E, frames_per_batch=E * T,
                              total_frames=4 * E * T) as c:
            list(c)
            assert c.run_number == run
    return url


def _expected_end_frames(store: daskrl.TrajectoryStore) -> dict[int, list[int]]:
    """From the env alone: a stream's envs start together and every episode lasts L steps, so
    at the stream's step g (counted over its batches) both envs end one when (g + 1) % L == 0;
    that is step t of the stream's k-th batch, g = k * T + t, at frame F + (t + 1) * E."""
    out: dict[int, list[int]] = defaultdict(list)
    frames: dict[int, int] = defaultdict(int)
    batches_of_stream: dict[tuple[int, int], int] = defaultdict(int)
    for bid, rec in store.records().items():
        run = run_of(bid)
        k = batches_of_stream[run, rec["stream"]]
        batches_of_stream[run, rec["stream"]] += 1
        first = frames[run]
        for t in range(T):
            if (k * T + t + 1) % LENGTHS[run] == 0:
                out[run] += [first + (t + 1) * E] * E
        frames[run] += rec["frames"]
    return out


def test_episodes_are_placed_at_the_frame_where_they_ended(two_runs):
    store = daskrl.open_store(two_runs)
    curves = run_curves(store)
    assert sorted(curves) == [0, 1]
    expected = _expected_end_frames(store)
    for run, c in curves.items():
        assert c.end_frames.tolist() == sorted(expected[run]), run
        length = LENGTHS[run]
        assert c.returns.tolist() == [length * (length + 1) / 2] * c.returns.size  # 1+2+..+L
        assert c.unplaced == 0 and c.env == "daskrl.testing:Counting-v0"
        # every episode lies strictly inside its batch's frames, and most are not at its end
        ends = {hi for _, hi in c.batch_ranges.values()}
        assert all(any(lo < x <= hi for lo, hi in c.batch_ranges.values())
                   for x in c.end_frames)
        assert sum(x not in ends for x in c.end_frames) > c.end_frames.size / 2
        assert c.batch_ranges == {bid: (i * E * T, (i + 1) * E * T) for i, bid in
                                  enumerate(b for b in store.batch_ids() if run_of(b) == run)}
        workers = {r["worker"] for b, r in store.records().items() if run_of(b) == run}
        assert set(c.worker_fps) == workers
        for xs, fps in c.worker_fps.values():
            assert set(xs.tolist()) <= ends and (fps > 0).all()


def test_the_figure_has_a_colour_per_run_and_a_panel_of_frames_per_second(two_runs):
    store = daskrl.open_store(two_runs)
    curves = run_curves(store)
    fig = plot_figure(store)
    ax, ax_fps = fig.axes
    dots = {c.get_gid(): c for c in ax.collections}
    means = {line.get_gid(): line for line in ax.lines}
    colours = {}
    for run, c in curves.items():
        offsets = dots[f"episodes-run-{run}"].get_offsets()
        assert offsets[:, 0].tolist() == c.end_frames.tolist()
        assert offsets[:, 1].tolist() == c.returns.tolist()
        line = means[f"mean-run-{run}"]
        assert line.get_xdata().tolist() == c.end_frames.tolist()
        colour = to_rgba(line.get_color())
        assert to_rgba(dots[f"episodes-run-{run}"].get_facecolor()[0], 1) == colour
        colours[run] = colour
        fps_lines = [ln for ln in ax_fps.lines if ln.get_gid().startswith(f"fps-run-{run}-")]
        assert len(fps_lines) == len(c.worker_fps)
        assert {to_rgba(ln.get_color()) for ln in fps_lines} == {colour}
    assert colours[0] != colours[1]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [f"run {r} (daskrl.testing:Counting-v0): {curves[r].returns.size} "
                      "episodes, mean of the last 100" for r in (0, 1)] + [
        "episodes, each at the frame where it ended"]
    assert len(ax_fps.get_legend().get_texts()) == sum(len(c.worker_fps)
                                                        for c in curves.values())
    assert ax_fps.get_xlabel() == "frames collected in the run"


def test_inspect_writes_the_png(two_runs, tmp_path, capsys):
    png = tmp_path / "plot.png"
    assert cli_main(["inspect", two_runs, "--plot", str(png)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"plot: {png}"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = matplotlib.image.imread(png)
    assert pixels.shape[:2] == (825, 990)  # 9 x 7.5 inches at 110 dpi
    assert len(np.unique(pixels.reshape(-1, pixels.shape[2]), axis=0)) > 50  # not blank


def test_a_batch_whose_data_is_gone_is_left_out_and_said(two_runs, tmp_path):
    store = daskrl.open_store(two_runs)
    bid = store.batch_ids()[1]
    rec = store.records()[bid]
    os.remove(os.path.join(two_runs, rec["path"]))  # deleted by something other than daskrl
    curves = run_curves(daskrl.open_store(two_runs))
    assert curves[0].unplaced == len(rec["episode_returns"]) > 0
    lo, hi = curves[0].batch_ranges[bid]
    assert not any(lo < x <= hi for x in curves[0].end_frames)
    fig = plot_figure(daskrl.open_store(two_runs))
    assert f"{curves[0].unplaced} episodes not shown: their batches cannot be read, or do not "\
           "hold their ends" in [
        t.get_text() for t in fig.axes[0].texts]
    assert plot_returns(daskrl.open_store(two_runs), tmp_path / "p.png").stat().st_size > 0


def test_a_resumed_run_goes_on_from_the_frames_of_the_run_it_resumes(tmp_path, inproc_client):
    url = str(tmp_path / "store")
    settings = dict(client=inproc_client, env_kwargs={"length": 3}, envs_per_worker=E,
                    frames_per_batch=E * T, total_frames=6 * E * T, num_workers=1)
    with daskrl.Collector("daskrl.testing:Counting-v0", TagPolicy(), url, **settings) as c:
        for i, _ in enumerate(c):
            if i == 1:
                break  # the learner stops part-way
    with daskrl.Collector("daskrl.testing:Counting-v0", TagPolicy(), url, resume=True,
                          **settings) as c:
        list(c)
        assert c.run_number == 1
    store = daskrl.open_store(url)
    curves = run_curves(store)
    before = sum(r["frames"] for b, r in store.records().items() if run_of(b) == 0)
    assert curves[0].resumes is None and curves[1].resumes == 0
    # run 1's batches follow run 0's frames: one curve over the whole collection's frames
    ranges = sorted(curves[1].batch_ranges.values())
    assert ranges[0][0] == before and ranges[-1][1] == 6 * E * T
    assert curves[1].end_frames.min() > before
    labels = [t.get_text() for t in plot_figure(store).axes[0].get_legend().get_texts()]
    assert any("run 1" in t and "resumes run 0" in t for t in labels), labels
