"""The daskrl error hierarchy.

Every error raised by daskrl derives from :class:`DaskrlError` and, where one fits, from the
matching builtin too, so ``except ValueError`` keeps working for callers that do not know
daskrl.  Messages say what was wrong, what was expected and what to do.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "ArrayNotFoundError",
    "BatchDataMissingError",
    "BatchNotFoundError",
    "BatchTimeoutError",
    "ClusterError",
    "ClusterTimeoutError",
    "CollectorClosedError",
    "ConfigError",
    "DaskrlError",
    "DatasetIndexError",
    "EnvError",
    "EnvInfoError",
    "EnvSpacesMismatchError",
    "ExportExistsError",
    "InternalError",
    "MetricsLoggerWarning",
    "MissingDependencyError",
    "PolicyError",
    "ResumeError",
    "ResumeMismatchError",
    "SlurmError",
    "SlurmJobError",
    "StoreError",
    "StoreFormatError",
    "StoreOptionsRequiredError",
    "StoreRecordWarning",
    "StoreURLError",
    "StreamError",
    "UnsupportedDtypeError",
    "UsageError",
    "VersionMismatchError",
    "WeightsIntegrityError",
    "WeightsNotSharedError",
    "WeightsUnavailableError",
    "WrapperError",
]


class DaskrlError(Exception):
    """Base class of every error daskrl raises."""

    whole_message: ClassVar[bool] = False
    """Whether the command line prints the whole message, not only its first line (``daskrl``
    prints one line unless ``--debug``): true where the details are what says what to fix."""


class ConfigError(DaskrlError, ValueError):
    """An option given to a :class:`~daskrl.Collector` or the CLI is invalid."""


class EnvError(DaskrlError, RuntimeError):
    """An environment could not be built, or misbehaved while collecting."""


class BatchTimeoutError(DaskrlError, TimeoutError):
    """A batch ran past its ``batch_timeout``; it was stopped and its data discarded."""


class PolicyError(DaskrlError, ValueError):
    """A policy cannot be shipped to workers, or its output does not fit the action space."""


class WeightsIntegrityError(DaskrlError, RuntimeError):
    """Weights received by a worker do not match the checksum the learner sent."""


class WeightsNotSharedError(DaskrlError, RuntimeError):
    """A worker cannot read the learner's shared-memory copy of the weights (it runs on another
    machine, as another user, or in another container); the collector then sends weights
    through Dask instead."""


class StoreError(DaskrlError, OSError):
    """The trajectory store cannot be created, written or read."""


class StoreFormatError(StoreError):
    """The store's layout or metadata is not one this version of daskrl can read."""


class StoreURLError(StoreError, ValueError):
    """The store URL or its ``storage_options`` are not ones daskrl can open (wrong type,
    unknown fsspec protocol, options the backend refuses)."""


class BatchNotFoundError(StoreError, KeyError):
    """No committed batch with the requested id exists in the store."""

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return str(self.args[0]) if self.args else ""


class ClusterTimeoutError(DaskrlError, TimeoutError):
    """A call to the Dask cluster on the learner's path (publishing weights, loading them,
    probing the store) did not complete within the collector's ``call_timeout``, and no
    responsive worker was left to do it instead."""


class BatchDataMissingError(StoreError):
    """A batch is committed but its data is missing: the store is damaged (its container was
    deleted or moved by something other than daskrl)."""


class StoreRecordWarning(UserWarning):
    """A listing skipped records of a store that cannot be read (see
    :meth:`~daskrl.TrajectoryStore.skipped_records`)."""


class CollectorClosedError(DaskrlError, RuntimeError):
    """The collector was used after :meth:`~daskrl.Collector.close`."""


class ClusterError(DaskrlError, ConnectionError):
    """The cluster cannot be reached or started: nothing listens at the scheduler's address, the
    connection or TLS handshake failed, or the cluster has had no workers for too long."""


class StreamError(ClusterError):
    """A stream's worker cannot reach the learner's listener, or a stream keeps failing to
    start; the message says which worker and what to check."""


class MissingDependencyError(DaskrlError, ImportError):
    """An optional dependency is not installed; the message has the ``pip install`` to run."""


class SlurmError(DaskrlError, RuntimeError):
    """The SLURM commands are missing or do not answer (``sbatch``, ``squeue``, ``scancel``)."""


class SlurmJobError(SlurmError):
    """SLURM refused a worker job, or its jobs ended before their Dask workers joined; the
    message has the job's state, exit code and the last lines of its log."""

    whole_message = True  # the job's log lines say what to fix


class WeightsUnavailableError(DaskrlError, RuntimeError):
    """A worker cannot get the weights version a batch asks for: it is no longer published (the
    collector closed) or the learner did not send it in time."""


class UsageError(DaskrlError, TypeError):
    """An API was called in a way its client does not allow (e.g. a synchronous call on a
    collector with an asynchronous client), or given an object of the wrong kind."""


class ArrayNotFoundError(StoreError, KeyError):
    """A batch has no array of the name asked for; the message lists the arrays it has."""


class UnsupportedDtypeError(DaskrlError, TypeError):
    """An array of a dtype the store format does not hold (numeric and bool only)."""


class VersionMismatchError(DaskrlError, RuntimeError):
    """Workers run other versions of the packages daskrl depends on than the learner."""


class StoreOptionsRequiredError(StoreError):
    """A handle of a store that needs ``storage_options`` (credentials, an endpoint) was loaded
    without its store: handles carry no credentials; pass ``store=`` (the collector's
    ``collector.store`` or an ``open_store(url, storage_options)``), or use ``store.load(handle)``."""


class DatasetIndexError(DaskrlError, IndexError):
    """An index past the end of a dataset (``TransitionDataset``)."""


class InternalError(DaskrlError, RuntimeError):
    """daskrl broke one of its own invariants: a bug in daskrl, not in what it was given.
    Please report it with the message."""


class ResumeError(ConfigError):
    """A collection cannot be resumed as asked (``resume=``): the run named is not in the store,
    another run resumed it already, or its record cannot be read."""


class ResumeMismatchError(ResumeError):
    """A setting of a resuming collector differs from the run it resumes (env, spaces,
    ``frames_per_batch``, ...): the message and :attr:`field` name it."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        """The setting that differs (e.g. ``"frames_per_batch"``)."""


class ExportExistsError(DaskrlError, FileExistsError):
    """The target of an export already exists (a Minari dataset of that id under that data
    path); choose another name, or overwrite it (``overwrite=True``, ``--overwrite``)."""


class MetricsLoggerWarning(RuntimeWarning):
    """A metrics logger given to a :class:`~daskrl.Collector` raised: the collector closed it
    (keeping what it had written) and sends it nothing more; the collection goes on."""


class WrapperError(ConfigError):
    """A wrapper spec (``wrappers=``, ``--wrapper``) cannot be parsed, its wrapper imported,
    or the wrapper applied to the env; the message names the spec and what to change."""


class EnvSpacesMismatchError(ConfigError):
    """The envs of one collection (``env=[...]``, ``--env`` given several times) do not all
    have the same observation and action spaces; the message names two that differ."""


class EnvInfoError(EnvError):
    """An entry of the envs' ``info`` named in ``info_keys`` cannot be stored: no env reported
    it, its shape varies between steps or envs, or it is not numeric. The message names the
    key, and the env index and step where one is at fault; collecting again does not help
    (``on_env_error="restart"`` does not retry it)."""
