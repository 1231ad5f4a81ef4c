"""The metrics feed without Dask: the failure rule on a real TensorBoard writer (read back),
the keys against the documented table, refusing what is not a logger, the missing extras."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from daskrl import MetricsLoggerWarning, MissingDependencyError, UsageError
from daskrl.collect._handover import HandOver
from daskrl.collect._metrics import MetricsFeed, batch_metrics
from daskrl.loggers import METRIC_KEYS, CallbackLogger, TensorBoardLogger, worker_key
from daskrl.store._handles import BatchHandle
from daskrl.store._store import TrajectoryStore

ROOT = Path(__file__).resolve().parents[2]


def _handle(batch_id: int, version: int, returns: tuple[float, ...] = (), worker="tcp://w:1"):
    return BatchHandle(store_url="file:///nowhere", batch_id=batch_id, frames=10,
                       weights_version=version, policy_lag=0, worker=worker, device="cpu",
                       episode_returns=returns, episode_lengths=tuple(int(r) for r in returns),
                       path=f"batches/{batch_id:012d}-x.zip", shape=(5, 2),
                       rollout_seconds=0.5, write_seconds=0.1)


def scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the event files under ``log_dir``: ``{tag: [(step, value), ...]}``."""
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


class FailingTensorBoardLogger(TensorBoardLogger):
    """A real TensorBoard logger that raises on its ``fail_at``-th call."""

    def __init__(self, log_dir, fail_at: int) -> None:
        super().__init__(log_dir, flush_secs=3600)  # nothing flushed but by close()
        self.calls, self.fail_at, self.closed = 0, fail_at, 0

    def log_metrics(self, metrics, step):
        self.calls += 1
        if self.calls == self.fail_at:
            raise OSError("disk full")
        super().log_metrics(metrics, step)

    def close(self):
        self.closed += 1
        super().close()


def _feed(handover: HandOver, feed: MetricsFeed, handles, store) -> list[BatchHandle]:
    out = []
    for h in handles:
        taken = handover.accept(h, newest_version=2)
        feed.handed_over(taken, handover.stats, weights_version=2, in_flight=0, store=store)
        out.append(taken)
    return out


def test_a_raising_logger_is_closed_keeps_what_it_wrote_and_the_others_go_on(tmp_path):
    failing = FailingTensorBoardLogger(tmp_path / "tb", fail_at=4)
    seen: list[tuple[int, dict]] = []
    feed = MetricsFeed([failing, lambda m, s: seen.append((s, dict(m)))])
    store = TrajectoryStore(str(tmp_path / "store"))
    handover = HandOver(None)
    # Calls: batch 0 -> episode 3.0, batch figures; batch 1 -> episode 5.0, then (4th) raises.
    with pytest.warns(MetricsLoggerWarning, match=re.escape(
            "the metrics logger TensorBoardLogger(") ) as record:
        _feed(handover, feed, [_handle(0, 1, (3.0,)), _handle(1, 2, (5.0, 7.0))], store)
        _feed(handover, feed, [_handle(2, 2, (9.0,))], store)
    assert len(record) == 1 and "raised OSError: disk full" in str(record[0].message)
    assert failing.closed == 1 and feed.loggers == [feed.loggers[0]]
    assert isinstance(feed.loggers[0], CallbackLogger)
    # What the failing logger wrote before it raised is in its event file (flushed by close).
    tb = scalars(tmp_path / "tb")
    assert tb["charts/episodic_return"] == [(10, 3.0), (20, 5.0)]
    assert tb["collector/batches"] == [(10, 1.0)]
    # The callback got everything: 4 episodes and 3 batches, at frames 10, 20, 30.
    episodes = [(s, m["charts/episodic_return"]) for s, m in seen if "charts/episodic_return" in m]
    assert episodes == [(10, 3.0), (20, 5.0), (20, 7.0), (30, 9.0)]
    batches = [(s, m["collector/policy_lag"], m["collector/batch_weights_version"])
               for s, m in seen if "collector/batches" in m]
    assert batches == [(10, 1, 1), (20, 0, 2), (30, 0, 2)]
    feed.close()
    feed.close()  # once
    assert failing.closed == 1 and not feed.loggers


def test_batch_metrics_are_the_documented_keys():
    handover = HandOver(None)
    h = handover.accept(_handle(0, 0, (1.0,), worker="tls://10.0.0.5:40123"), 0)
    metrics = batch_metrics(h, handover.stats, weights_version=0, in_flight=3, store_bytes=5)
    templates = {k.replace("{worker}", "10.0.0.5:40123") for k in METRIC_KEYS}
    assert set(metrics) == templates - {"charts/episodic_return", "charts/episodic_length"}
    assert metrics["collector/in_flight"] == 3 and metrics["collector/store_bytes"] == 5
    assert metrics["workers/10.0.0.5:40123/rollout_fps"] == 20.0  # 10 frames in 0.5 s
    # The docs' table lists exactly these keys, in this order.
    page = (ROOT / "docs" / "integrations" / "logging.md").read_text()
    table = page.split("| Key | Meaning |\n|---|---|\n", 1)[1].split("\n\n", 1)[0]
    documented = re.findall(r"^\| `([^`]+)` \| [^|]+ \|$", table, flags=re.M)
    assert documented == list(METRIC_KEYS)


def test_worker_keys_are_names_every_backend_accepts():
    assert worker_key("tcp://127.0.0.1:4000", "fps") == "workers/127.0.0.1:4000/fps"
    assert worker_key("tls://[::1]:4000", "fps") == "workers/_::1_:4000/fps"
    assert worker_key("inproc://10.1.2.3/77/2", "fps") == "workers/10.1.2.3_77_2/fps"


def test_what_is_not_a_logger_is_refused_before_anything_starts(tmp_path):
    import daskrl

    with pytest.raises(UsageError, match=re.escape(
            "loggers[1] got 42 (int), which is neither a metrics logger")):
        daskrl.Collector("CartPole-v1", None, str(tmp_path / "s"), loggers=[print, 42])
    with pytest.raises(UsageError, match=re.escape(
            "loggers must be a list of metrics loggers or callables, got 'runs/tb'")):
        daskrl.Collector("CartPole-v1", None, str(tmp_path / "s"), loggers="runs/tb")
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(("name", "hidden", "extra"), [
    ("TensorBoardLogger", ["tensorboard", "torch.utils.tensorboard"], "tensorboard"),
    ("WandbLogger", ["wandb"], "wandb"),
    ("MLflowLogger", ["mlflow", "mlflow.tracking", "mlflow.entities"], "mlflow"),
])
def test_a_missing_extra_names_its_pip_install(monkeypatch, tmp_path, name, hidden, extra):
    import daskrl.loggers

    for module in hidden:  # as if the package were not installed: its import fails
        monkeypatch.setitem(sys.modules, module, None)
    cls = getattr(daskrl.loggers, name)
    with pytest.raises(MissingDependencyError, match=re.escape(
            f'Install it with: pip install "daskrl[{extra}]"')):
        cls(str(tmp_path)) if name == "TensorBoardLogger" else cls()



def test_with_the_warning_as_an_error_the_logger_is_closed_first(tmp_path):
    import warnings

    failing = FailingTensorBoardLogger(tmp_path / "tb", fail_at=2)
    feed = MetricsFeed([failing])
    with warnings.catch_warnings():
        warnings.simplefilter("error", MetricsLoggerWarning)
        with pytest.raises(MetricsLoggerWarning, match="raised OSError: disk full"):
            _feed(HandOver(None), feed, [_handle(0, 0, (3.0,))],
                  TrajectoryStore(str(tmp_path / "s")))
    assert failing.closed == 1 and not feed.loggers
    assert scalars(tmp_path / "tb") == {"charts/episodic_return": [(10, 3.0)],
                                        "charts/episodic_length": [(10, 3.0)]}
