"""Metrics sinks: where a :class:`~daskrl.Collector` sends its running metrics as it collects.

``Collector(..., loggers=[...])`` takes :class:`MetricsLogger` objects (``log_metrics(metrics,
step)`` and ``close()``) or plain callables ``f(metrics, step)``: TensorBoard
(:class:`TensorBoardLogger`), Weights & Biases (:class:`WandbLogger`) and MLflow
(:class:`MLflowLogger`) are here, each behind its extra. The keys are :data:`METRIC_KEYS`
(cleanrl's where it has one: ``charts/episodic_return``, ``charts/SPS``...).
"""

from __future__ import annotations

from daskrl.loggers._keys import METRIC_KEYS, worker_key
from daskrl.loggers._mlflow import MLflowLogger
from daskrl.loggers._protocol import CallbackLogger, LoggerLike, MetricsCallback, MetricsLogger
from daskrl.loggers._tensorboard import TensorBoardLogger
from daskrl.loggers._wandb import WandbLogger

__all__ = ["METRIC_KEYS", "CallbackLogger", "LoggerLike", "MLflowLogger", "MetricsCallback",
           "MetricsLogger", "TensorBoardLogger", "WandbLogger", "worker_key"]
