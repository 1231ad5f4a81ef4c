"""MLflow: metrics logged to an MLflow run through an ``MlflowClient`` (no global active run)."""

from __future__ import annotations

import time
from collections.abc import Mapping

from daskrl.errors import MissingDependencyError

__all__ = ["MLflowLogger"]


class MLflowLogger:
    """Log metrics to an MLflow run.

    Each call is one ``log_batch`` request; MLflow keeps every value of a key at a step, so
    the episodes of one batch all appear. Needs ``pip install "daskrl[mlflow]"``.

    Parameters
    ----------
    run_id
        An existing run to log to, left open by :meth:`close`; ``None`` creates a run in
        ``experiment_name`` (created if missing), set to finished by :meth:`close`.
    tracking_uri
        Where MLflow keeps runs (``http://host:5000``, ``sqlite:///mlflow.db``, a
        ``file://`` directory); ``None``: MLflow's default (``MLFLOW_TRACKING_URI``).
    experiment_name, run_name, tags
        Of the run created when ``run_id`` is ``None``.
    """

    def __init__(self, run_id: str | None = None, *, tracking_uri: str | None = None,
                 experiment_name: str = "daskrl", run_name: str | None = None,
                 tags: Mapping[str, str] | None = None) -> None:
        try:
            from mlflow.entities import Metric
            from mlflow.tracking import MlflowClient
        except ImportError as e:
            raise MissingDependencyError(
                f"MLflowLogger needs the mlflow package, which is not installed ({e}). "
                'Install it with: pip install "daskrl[mlflow]"') from None
        self._metric = Metric
        self.client = MlflowClient(tracking_uri)
        """The ``MlflowClient`` (log params, artifacts, the learner's own metrics...)."""
        self.owns_run = run_id is None
        if run_id is None:
            experiment = self.client.get_experiment_by_name(experiment_name)
            experiment_id = (experiment.experiment_id if experiment is not None
                             else self.client.create_experiment(experiment_name))
            run = self.client.create_run(experiment_id, run_name=run_name, tags=dict(tags or {}))
            run_id = run.info.run_id
        self.run_id: str = run_id
        """The run's id."""

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Log ``metrics`` at ``step`` in one request."""
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[
            self._metric(key, float(value), now, int(step)) for key, value in metrics.items()])

    def close(self) -> None:
        """Mark the run finished if this logger created it."""
        if self.owns_run:
            self.client.set_terminated(self.run_id)

    def __repr__(self) -> str:
        return f"MLflowLogger(run_id={self.run_id!r})"
