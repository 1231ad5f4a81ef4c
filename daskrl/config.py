"""Validated collection settings.

:class:`CollectorConfig` gathers the algorithm-side options of a collector.  It is frozen and
validated in ``__post_init__`` on the learner, so bad input fails before any worker spends time.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypedDict

from daskrl._option_names import REMOVED_OPTIONS, RENAMED_OPTIONS, check_names, renamed_options
from daskrl._renamed import Renamed
from daskrl._settings import (
    DeviceSetting,
    WrapperSpec,
    check_device_setting,
    check_env_vars,
    check_info_keys,
    parse_wrappers,
)
from daskrl.errors import ConfigError
from daskrl.store._format.compression import Compression

__all__ = ["REMOVED_OPTIONS", "RENAMED_OPTIONS", "CollectorConfig", "CollectorOptions",
           "Compression", "check_option_names", "check_seconds", "renamed_options"]

MAX_FRAMES_PER_BATCH = 1 << 24
"""Frames of one batch must stay below this (batch data is indexed with 24 bits)."""

LEARNER_SIDE = ("device", "env_kwargs", "env_vars", "lost_workers_timeout", "call_timeout",
                "shared_memory")
"""Fields about where and how this run's collection happens, not what it collects: not
stored with the run (:meth:`CollectorConfig.as_dict`)."""


def _positive_int(name: str, value: Any, *, allow_none: bool = False, minimum: int = 1) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        expected = f"an integer >= {minimum}" + (" or None" if allow_none else "")
        raise ConfigError(f"{name} must be {expected}, got {value!r}.")


def check_seconds(name: str, value: Any, *, allow_none: bool = False) -> None:
    """Raise :class:`ConfigError` unless ``value`` is a positive, finite number of seconds
    (not a bool, not NaN), or None where ``allow_none``."""
    if value is None and allow_none:
        return
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value <= 0):
        none = " (None: no limit)" if allow_none else ""
        raise ConfigError(
            f"{name} must be a positive, finite number of seconds{none}, got {value!r}."
        )


@dataclasses.dataclass(frozen=True)
class CollectorConfig:
    """Algorithm-side settings of a collection run (see :class:`daskrl.Collector`)."""

    envs_per_worker: int = dataclasses.field(default=8, metadata={
        "help": "environments stepped together in one task (the E of a [T, E] batch)"})
    """Environments stepped together in one task (the ``E`` of a ``[T, E]`` batch)."""
    frames_per_batch: int = dataclasses.field(default=4096, metadata={
        "help": "env steps per batch, summed over its envs; a multiple of envs_per_worker"})
    """Env steps summed over the batch's envs; a multiple of ``envs_per_worker``."""
    total_frames: int | None = dataclasses.field(default=200_000, metadata={
        "help": "frames to collect in all (exact); 'none': until interrupted"})
    """Frames to collect in all (exact); ``None`` collects until the collector is closed."""
    max_frames_per_traj: int | None = dataclasses.field(default=None, metadata={
        "help": "truncate episodes longer than this (truncated=True is stored)"})
    """Truncate episodes longer than this (``truncated=True`` is stored)."""
    init_random_frames: int = dataclasses.field(default=0, metadata={
        "help": "the first frames of the run use actions sampled from the action space"})
    """The first frames of the run use actions sampled from the action space."""
    reset_at_each_iter: bool = dataclasses.field(default=False, metadata={
        "help": "reset every env at the start of each batch instead of continuing episodes"})
    """Reset every env at the start of each batch instead of continuing episodes."""
    rounds: bool = dataclasses.field(default=True, metadata={
        "help": "rounds of batches on one weights version; off: first finished, first out"})
    """True: rounds of batches on one weights version, handed over in batch order; False:
    first finished, first out (``batches_in_flight`` per stream). ``sync`` is a deprecated
    alias."""
    seed: int = dataclasses.field(
        default=0, metadata={"help": "root of every env's and policy's random stream"})
    """Root of every env's and policy's random stream."""
    num_workers: int | None = dataclasses.field(default=None, metadata={
        "help": "batches collected in parallel (default: the cluster's worker count)"})
    """Batches collected in parallel (default: the cluster's worker count): the number of
    streams. With several envs (``env=[...]``), a multiple of their number (default: the largest
    multiple the cluster's workers allow)."""
    batches_in_flight: int = dataclasses.field(default=2, metadata={
        "help": "with rounds off: batches queued or running per stream (backpressure)"})
    """``rounds=False``: batches queued or running per stream. Two keep a worker busy while the
    learner takes the previous handle; it also bounds what the store and memory hold ahead of
    a slow learner (backpressure)."""
    compression: Compression = dataclasses.field(default=Compression.ZSTD, metadata={
        "help": "compressor for the stored chunks (a checksum is always added)"})
    """Compressor for the stored chunks (arrays it shrinks by less than 10 % are stored raw)."""
    batch_timeout: float | None = dataclasses.field(default=None, metadata={
        "help": "seconds a batch may take on its worker before it is stopped and discarded"})
    """Seconds a batch may take on its worker; past it the batch is stopped (checked between
    steps) and its partial data discarded. Dask has no task timeout of its own."""
    on_env_error: str = dataclasses.field(default="raise", metadata={
        "help": "on an env error: 'raise' ends collection; 'restart' rebuilds the stream's "
                "envs and collects the batch again"})
    """``"raise"``: an env error ends collection with an error naming env, worker, step and
    weights version. ``"restart"``: rebuild the stream's envs and collect the batch again (up
    to ``max_env_restarts`` times; counted in ``BatchHandle.env_restarts``)."""
    max_env_restarts: int = dataclasses.field(default=3, metadata={
        "help": "with on_env_error='restart': env rebuilds allowed per batch before the error "
                "is raised"})
    """With ``on_env_error="restart"``: rebuilds allowed per batch before the error is raised."""
    max_policy_lag: int | None = dataclasses.field(default=None, metadata={
        "help": "drop (and collect again) a batch more than this many weights versions behind "
                "the learner's newest at hand-over ('none': no limit)"})
    """Hand over no batch whose policy lag (the learner's newest weights version at hand-over
    minus the batch's ``weights_version``) exceeds this: such a batch is dropped and its frames
    are collected again with the newest weights, so the learner still gets ``total_frames``.
    A dropped batch stays committed in the store (it is real data, and commits are never
    undone); ``Collector.summary()["dropped_stale"]`` counts them. ``None``: no limit."""
    device: DeviceSetting = dataclasses.field(default="auto", metadata={
        "help": "policy device on workers", "flag": "by hand"})
    """The policy's device on each worker: ``"auto"`` (a GPU if the worker has one), a device,
    or ``{worker name: device}``."""
    env_kwargs: Mapping[str, Any] | None = dataclasses.field(default=None, metadata={
        "help": "keyword arguments for gymnasium.make", "flag": "by hand"})
    """Keyword arguments for ``gymnasium.make`` (with an env id)."""
    env_vars: Mapping[str, Any] | None = dataclasses.field(default=None, metadata={
        "help": "environment variables set on workers", "flag": "by hand"})
    """Environment variables set on every worker before its envs are built."""
    lost_workers_timeout: float = dataclasses.field(default=60.0, metadata={
        "help": "seconds the cluster may have no workers before collection stops with an "
                "error"})
    """Seconds the cluster may have no worker at all before collection fails."""
    call_timeout: float = dataclasses.field(default=30.0, metadata={
        "help": "seconds any one call to the scheduler or a worker may take (a cut-off host "
                "fails it instead of hanging the learner)"})
    """Seconds any one call to the cluster on the learner's path may take (publishing or
    loading weights, probing the store, asking the scheduler); also how long a worker may stay
    silent before the collector stops using it (its batches are submitted again elsewhere)."""
    shared_memory: bool = dataclasses.field(default=True, metadata={
        "help": "weights through one shared-memory copy for workers on the learner's host",
        "flag": "by hand"})
    """Workers on the learner's machine read each weights version from one copy in shared
    memory instead of receiving it over a socket (Dask transfers for the others)."""
    weights_in_store: bool = dataclasses.field(default=False, metadata={
        "help": "write each weights version once to the store; workers read it from there, "
                "once per host, instead of through Dask (clusters of many hosts)"})
    """Each weights version is written once to the store (under ``runs/weights-<id>/``) and
    read from there by the first worker of each host, which leaves it in the host's shared
    memory for the others; the scheduler carries none of it. For clusters of many hosts on a
    shared filesystem or object store; see ``docs/devices-and-weights.md``."""
    resume: bool | int = dataclasses.field(default=False, metadata={
        "help": "continue the store's latest run (or run RUN) after a crash: its committed "
                "frames count toward total_frames; a store with no run starts a new one",
        "metavar": "RUN"})
    """Continue an interrupted collection in this store instead of starting from zero frames:
    ``True`` resumes the latest run, an ``int`` the run of that number. Frames already
    committed by that run (and the runs it resumed) count toward ``total_frames``; the other
    settings that shape the data must agree with the run's (see
    ``docs/integrations/resume.md``). ``True`` on a store with no run starts a new one."""
    wrappers: tuple[str, ...] = dataclasses.field(default=(), metadata={
        "help": "gymnasium wrappers applied in order to every env", "flag": "by hand"})
    """Wrappers applied in order (the first innermost) to every env a worker makes, and to the
    learner's probe of the spaces: specs ``"package.module.Wrapper"`` or
    ``"package.module.Wrapper:KEY=VALUE,..."`` with Python literals as values, e.g.
    ``"gymnasium.wrappers.FrameStackObservation:stack_size=4"`` (``docs/env-kinds.md``,
    "Wrappers"). Stored with the run, in canonical form."""
    info_keys: tuple[str, ...] = dataclasses.field(default=(), metadata={
        "help": "entries of the envs' info to store as per-step arrays info/KEY (and masks "
                "info/_KEY); e.g. --info-keys lives is_success", "metavar": "KEY"})
    """Entries of the envs' ``info`` to store as per-step arrays ``info/<key>`` ``[T, E, ...]``,
    each with its mask ``info/_<key>`` (True where the env reported the key at that step); a
    dict entry (``episode``) as ``info/<key>/<sub>``. Numeric entries of one fixed shape only
    (:class:`~daskrl.EnvInfoError` otherwise). See ``docs/env-kinds.md``."""
    store_policy_state: Literal["first", "every_step"] = dataclasses.field(
        default="first", metadata={
            "help": "a recurrent policy's state stored with each batch: 'first', before its "
                    "first step ([E, ...]); 'every_step', before every step ([T, E, ...])"})
    """What a batch of a recurrent policy (``docs/recurrent.md``) stores as ``policy_state``:
    ``"first"``, the state before the batch's first step ``[E, ...]``; ``"every_step"``, the
    state before every step ``[T, E, ...]`` (for learners that cut sequences anywhere)."""
    vectorization_mode: Literal["sync", "async", "vector_entry_point"] | None = (
        dataclasses.field(default=None, metadata={
            "help": "step a gymnasium id's envs_per_worker envs as one vector env made by "
                    "gymnasium.make_vec in this mode (default: single envs)"}))
    """With a gymnasium id: build each stream's ``envs_per_worker`` envs as one vector env,
    ``gymnasium.make_vec(env, num_envs=envs_per_worker, vectorization_mode=...)``
    (``docs/env-kinds.md``). An env factory that returns a vector env needs none of this."""
    vector_kwargs: Mapping[str, Any] | None = dataclasses.field(default=None, metadata={
        "help": "keyword arguments for the vector env (gymnasium.make_vec's vector_kwargs)",
        "flag": "by hand"})
    """With :attr:`vectorization_mode`: ``gymnasium.make_vec``'s ``vector_kwargs``, e.g.
    ``{"autoreset_mode": "SameStep"}`` or ``{"context": "spawn"}``."""
    sync = Renamed("rounds")
    """Deprecated alias of :attr:`rounds`."""

    def __post_init__(self) -> None:
        _positive_int("envs_per_worker", self.envs_per_worker)
        _positive_int("frames_per_batch", self.frames_per_batch)
        if self.frames_per_batch >= MAX_FRAMES_PER_BATCH:
            raise ConfigError(f"frames_per_batch must be below {MAX_FRAMES_PER_BATCH}, "
                              f"got {self.frames_per_batch}.")
        _positive_int("total_frames", self.total_frames, allow_none=True)
        _positive_int("max_frames_per_traj", self.max_frames_per_traj, allow_none=True)
        _positive_int("init_random_frames", self.init_random_frames, minimum=0)
        _positive_int("num_workers", self.num_workers, allow_none=True)
        _positive_int("batches_in_flight", self.batches_in_flight)
        _positive_int("max_env_restarts", self.max_env_restarts, minimum=0)
        check_seconds("batch_timeout", self.batch_timeout, allow_none=True)
        if self.on_env_error not in ("raise", "restart"):
            raise ConfigError(
                f"on_env_error must be 'raise' or 'restart', got {self.on_env_error!r}."
            )
        _positive_int("max_policy_lag", self.max_policy_lag, allow_none=True, minimum=0)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {self.seed!r}.")
        e = self.envs_per_worker
        if self.frames_per_batch % e:
            lo = max(e, self.frames_per_batch // e * e)
            raise ConfigError(
                f"frames_per_batch={self.frames_per_batch} is not a multiple of "
                f"envs_per_worker={e}: each batch is [T, E] with E={e}. "
                f"Use frames_per_batch={lo} or {lo + e}."
            )
        if self.total_frames is not None and self.total_frames % e:
            lo = max(e, self.total_frames // e * e)
            raise ConfigError(
                f"total_frames={self.total_frames} is not a multiple of envs_per_worker={e}, "
                f"so it cannot be collected exactly. Use total_frames={lo} or {lo + e}."
            )
        check_seconds("lost_workers_timeout", self.lost_workers_timeout)
        check_seconds("call_timeout", self.call_timeout)
        if not isinstance(self.shared_memory, bool):
            raise ConfigError(f"shared_memory must be True or False, got {self.shared_memory!r}.")
        if not isinstance(self.weights_in_store, bool):
            raise ConfigError("weights_in_store must be True or False, got "
                              f"{self.weights_in_store!r}.")
        object.__setattr__(self, "device", check_device_setting(self.device))
        object.__setattr__(self, "env_kwargs", check_mapping("env_kwargs", self.env_kwargs))
        object.__setattr__(self, "env_vars",
                           check_env_vars(check_mapping("env_vars", self.env_vars)))
        try:
            object.__setattr__(self, "compression", Compression(self.compression))
        except ValueError:
            choices = ", ".join(repr(c.value) for c in Compression)
            raise ConfigError(
                f"compression must be one of {choices}, got {self.compression!r}."
            ) from None
        object.__setattr__(self, "wrappers",
                           tuple(w.text for w in parse_wrappers(self.wrappers)))
        try:
            object.__setattr__(self, "info_keys", check_info_keys(self.info_keys))
        except ValueError as e:
            raise ConfigError(f"{e}.") from None
        object.__setattr__(self, "vector_kwargs", check_mapping("vector_kwargs",
                                                                self.vector_kwargs))
        if self.store_policy_state not in ("first", "every_step"):
            raise ConfigError(f"store_policy_state must be 'first' or 'every_step', got "
                              f"{self.store_policy_state!r}.")
        modes = ("sync", "async", "vector_entry_point")
        if self.vectorization_mode is not None and self.vectorization_mode not in modes:
            raise ConfigError(f"vectorization_mode must be one of {', '.join(map(repr, modes))} "
                              f"or None, got {self.vectorization_mode!r}.")
        if self.vector_kwargs and self.vectorization_mode is None:
            raise ConfigError("vector_kwargs apply to a vector env made by gymnasium.make_vec: "
                              "give vectorization_mode too.")
        if not isinstance(self.resume, int) or (not isinstance(self.resume, bool)
                                                and self.resume < 0):
            raise ConfigError(f"resume must be True, False or a run number (an integer >= 0), "
                              f"got {self.resume!r}.")

    @property
    def wrapper_specs(self) -> tuple[WrapperSpec, ...]:
        """:attr:`wrappers`, parsed."""
        return parse_wrappers(self.wrappers)

    @property
    def steps_per_batch(self) -> int:
        """``T``: vector steps in a full batch."""
        return self.frames_per_batch // self.envs_per_worker

    def batch_frames(self, done: int = 0) -> Any:
        """Yield the frame count of each batch in order (the last one may be shorter), for
        the frames of ``total_frames`` left once ``done`` are collected (a resumed run)."""
        if self.total_frames is None:
            while True:
                yield self.frames_per_batch
        left = self.total_frames - done
        while left > 0:
            n = min(self.frames_per_batch, left)
            yield n
            left -= n

    def random_steps(self, first_frame: int, steps: int) -> int:
        """How many of a batch's first steps use random actions, given its first frame."""
        left = self.init_random_frames - first_frame
        if left <= 0:
            return 0
        return min(steps, -(-left // self.envs_per_worker))

    def as_dict(self) -> dict[str, Any]:
        """Plain-JSON form, stored with each run."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
             if f.name not in LEARNER_SIDE}
        d["compression"] = self.compression.value
        d["wrappers"] = list(self.wrappers)
        d["info_keys"] = list(self.info_keys)
        d["vector_kwargs"] = _jsonable(self.vector_kwargs or {})
        return d


def _jsonable(value: Any) -> Any:
    """``value`` as JSON keeps it (run records are JSON): enums by their value (an
    ``AutoresetMode`` as ``"SameStep"``), other objects by their ``repr``."""
    import json

    return json.loads(json.dumps(value, sort_keys=True,
                                 default=lambda o: getattr(o, "value", repr(o))))


def check_mapping(name: str, value: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validate an optional ``{str: ...}`` mapping option."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ConfigError(f"{name} must be a mapping with string keys, got {value!r}.")
    return dict(value)


class CollectorOptions(TypedDict, total=False):
    """The keyword options of :class:`daskrl.Collector`: the fields of
    :class:`CollectorConfig` (defaults and validation live there)."""

    envs_per_worker: int
    frames_per_batch: int
    total_frames: int | None
    max_frames_per_traj: int | None
    init_random_frames: int
    reset_at_each_iter: bool
    rounds: bool
    sync: bool
    """Deprecated: :attr:`CollectorConfig.rounds`."""
    seed: int
    num_workers: int | None
    batches_in_flight: int
    compression: Compression | str
    batch_timeout: float | None
    on_env_error: str
    max_env_restarts: int
    max_policy_lag: int | None
    device: DeviceSetting
    env_kwargs: Mapping[str, Any] | None
    env_vars: Mapping[str, Any] | None
    lost_workers_timeout: float
    call_timeout: float
    shared_memory: bool
    weights_in_store: bool
    resume: bool | int
    wrappers: tuple[str, ...] | list[str] | str
    info_keys: Sequence[str]
    store_policy_state: str
    vectorization_mode: str | None
    vector_kwargs: Mapping[str, Any] | None


def check_option_names(options: Mapping[str, Any], owner: str = "Collector") -> None:
    """Refuse a removed option, or a name that is not an option of :class:`CollectorConfig`,
    with what to do instead (``owner`` names what was given them, for the message)."""
    check_names(options, [f.name for f in dataclasses.fields(CollectorConfig)], owner)


def _checked_init(init: Callable[..., None]) -> Callable[..., None]:
    """``CollectorConfig.__init__`` that names an unknown keyword (and the option it may
    have meant) and takes the deprecated names, instead of Python's bare ``TypeError``."""
    @functools.wraps(init)
    def __init__(self: CollectorConfig, *args: Any, **kwargs: Any) -> None:
        check_option_names(kwargs, "CollectorConfig")
        init(self, *args, **renamed_options(kwargs, stacklevel=2))

    return __init__


setattr(CollectorConfig, "__init__", _checked_init(CollectorConfig.__init__))  # noqa: B010
