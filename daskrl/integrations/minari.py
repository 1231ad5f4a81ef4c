"""Minari export: a store's episodes written as a `Minari <https://minari.farama.org>`_ dataset,
the Farama Foundation's offline-RL format, so that ``minari.load_dataset`` and the tools built on
it read them.  Needs the ``minari`` extra (``pip install "daskrl[minari]"``: minari and h5py).

This module writes the dataset and decides where; :mod:`._minari_episodes` maps daskrl's
episodes to Minari's (which episodes go, with what flags) and finds the env spec the dataset
records.  The data is read from the store, never collected again.  See
``docs/integrations/minari.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import shutil
import threading
import warnings
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from daskrl._nested import iter_leaves
from daskrl.errors import ConfigError, ExportExistsError, MissingDependencyError
from daskrl.integrations._minari_episodes import (
    CutEpisodes,
    env_spaces,
    env_spec,
    episode_buffers,
    select_runs,
)
from daskrl.store._store import TrajectoryStore, open_store

if TYPE_CHECKING:
    from gymnasium.envs.registration import EnvSpec
    from minari import MinariDataset
    from minari.data_collector import EpisodeBuffer

__all__ = ["CutEpisodes", "MinariExport", "export_minari"]

_CHUNK_BYTES = 64 << 20
"""Episodes go to Minari in lists of about this many bytes: memory stays bounded."""
_ROOT_LOCK = threading.Lock()  # MINARI_DATASETS_PATH is process-wide


@dataclasses.dataclass(frozen=True)
class MinariExport:
    """What :func:`export_minari` wrote."""

    dataset_id: str
    path: str
    """The dataset's directory, ``<data path>/<dataset_id>``."""
    runs: tuple[int, ...]
    """The store's runs whose episodes were exported."""
    episodes: int
    """Episodes in the dataset."""
    steps: int
    """Steps (transitions) in the dataset."""
    cut_dropped: int
    """Cut episodes left out (``cut="drop"``)."""
    cut_truncated: int
    """Cut episodes exported as truncated (``cut="truncate"``)."""
    partial_skipped: int
    """Episodes with steps missing (some of their batches were deleted): never exported."""

    def load(self) -> MinariDataset:
        """The dataset, opened with Minari (``minari.MinariDataset`` of its data directory)."""
        import minari

        return minari.MinariDataset(Path(self.path) / "data")


def export_minari(
    store: str | os.PathLike[str] | TrajectoryStore,
    dataset_id: str,
    *,
    runs: int | Collection[int] | None = None,
    data_path: str | os.PathLike[str] | None = None,
    cut: CutEpisodes = "drop",
    overwrite: bool = False,
    env: str | EnvSpec | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    author: str | None = None,
    author_email: str | None = None,
    code_permalink: str | None = None,
    algorithm_name: str | None = None,
    description: str | None = None,
) -> MinariExport:
    """Write a store's episodes as the Minari dataset ``dataset_id``.

    Each episode (reassembled across the batches it spans) becomes one Minari episode:
    ``observations`` are its ``observation`` rows plus the ``next_observation`` of its last
    step (``len(actions) + 1`` of them), ``actions``, ``rewards``, ``terminations`` and
    ``truncations`` are its rows as stored; ``infos`` is empty (daskrl stores no env infos).
    Each Minari episode's metadata names where it came from: ``daskrl_episode_id``,
    ``daskrl_run``, ``daskrl_batch_ids``, ``daskrl_cut``.

    Parameters
    ----------
    store
        The store (a URL or path, opened with ``storage_options``, or an open store).
    dataset_id
        Minari id, ``(namespace/)name-v<version>``, e.g. ``"cartpole/daskrl-v0"``.
    runs
        The runs to export (a run number or several); None: every run, which must then have
        collected the same env.
    data_path
        Minari's root directory of datasets; None: ``MINARI_DATASETS_PATH``, or Minari's
        default ``~/.minari/datasets``.
    cut
        Episodes still running when the collection stopped: ``"drop"`` (default) leaves them
        out; ``"truncate"`` exports them with ``truncations[-1] = True``.
    overwrite
        Replace an existing dataset of that id; otherwise it raises
        :class:`~daskrl.ExportExistsError`.
    env, env_kwargs
        The env the dataset records (its spec, observation and action spaces): by default the
        gymnasium id in the runs' record; give ``env`` for a run collected with an env factory,
        and ``env_kwargs`` when the collection passed some (they are not recorded).  The runs'
        ``max_frames_per_traj`` becomes the spec's ``max_episode_steps`` where it is lower.
    author, author_email, code_permalink, algorithm_name, description
        Minari's dataset metadata; ``description`` defaults to one naming the store and runs.

    Raises
    ------
    MissingDependencyError
        minari or h5py is not installed.
    ExportExistsError
        The dataset exists and ``overwrite`` is False.
    ConfigError
        A bad id, run, ``cut`` or env; stored arrays that do not fit the env's spaces; nothing
        to export.
    """
    if cut not in ("drop", "truncate"):
        raise ConfigError(f"cut must be 'drop' or 'truncate', got {cut!r}.")
    minari = _import_minari()
    _check_dataset_id(dataset_id)
    st = store if isinstance(store, TrajectoryStore) else open_store(store, storage_options)
    settings = select_runs(st, runs)
    spec = env_spec(settings, env, env_kwargs)
    obs_space, act_space = env_spaces(spec)
    with _datasets_root(data_path):
        target = Path(minari.storage.get_dataset_path(dataset_id))
    if target.exists() and not overwrite:
        raise _exists(dataset_id, target)

    counts = {"drop": 0, "truncate": 0, "partial": 0}
    episodes = episode_buffers(st, settings, cut, obs_space, act_space, counts)
    dataset: MinariDataset | None = None
    backup: Path | None = None  # the dataset replaced (overwrite), until the new one is whole
    steps = 0
    writing = False
    try:
        for chunk, metas in _chunks(episodes):
            if dataset is None:
                if target.exists():  # overwrite: set aside once the first episodes are read
                    backup = target.with_name(f"{target.name}.daskrl-replaced-{os.getpid()}")
                    target.rename(backup)
                if target.exists():  # another export made it meanwhile
                    raise _exists(dataset_id, target)
                writing = True
                with _datasets_root(data_path), _quiet_nags():
                    dataset = minari.create_dataset_from_buffers(
                        dataset_id, chunk, env=spec, eval_env=spec,
                        observation_space=obs_space, action_space=act_space,
                        author=author, author_email=author_email,
                        code_permalink=code_permalink, algorithm_name=algorithm_name,
                        description=description or "", jpeg_encoding=False)
                first = 0
            else:
                first = dataset.storage.total_episodes
                dataset.update_dataset_from_buffer(chunk)
            dataset.storage.update_episode_metadata(metas, range(first, first + len(chunk)))
            steps += sum(len(b.rewards) for b in chunk)
        if dataset is None:
            raise ConfigError(
                f"run(s) {sorted(settings)} of {st.url!r} hold no episode to export "
                f"({counts['drop']} cut by the end of the collection, {counts['partial']} with "
                "deleted batches). Export the cut ones as truncated (cut='truncate', --cut "
                "truncate), or collect more frames.")
        if description is None:
            dataset.storage.update_metadata({"description": _description(
                st, settings, cut, dataset.storage.total_episodes, counts)})
    except BaseException:
        if writing:  # no half-written dataset is left
            shutil.rmtree(target, ignore_errors=True)
        if backup is not None:  # and the one it was to replace is back
            backup.rename(target)
        raise
    if backup is not None:
        shutil.rmtree(backup)
    return MinariExport(dataset_id, str(target), tuple(sorted(settings)),
                        int(dataset.storage.total_episodes), steps, counts["drop"],
                        counts["truncate"], counts["partial"])


def _exists(dataset_id: str, target: Path) -> ExportExistsError:
    return ExportExistsError(
        f"a Minari dataset {dataset_id!r} already exists at {str(target)!r}. Choose another id "
        "(e.g. a higher -v<version>), or replace it with overwrite=True (--overwrite).")


def _import_minari() -> Any:
    try:
        import minari
        import minari.storage

        importlib.import_module("h5py")  # Minari's default storage; after minari (above)
    except ImportError as e:
        raise MissingDependencyError(
            f"exporting a Minari dataset needs minari and h5py ({e}). Install them with: "
            'pip install "daskrl[minari]"') from None
    return minari


def _check_dataset_id(dataset_id: str) -> None:
    from minari.dataset.minari_dataset import parse_dataset_id

    try:
        parse_dataset_id(dataset_id)
    except (ValueError, TypeError):  # TypeError: Minari's parser on an id without -v<version>
        raise ConfigError(
            f"{dataset_id!r} is not a Minari dataset id: it takes the form "
            "(namespace/)name-v<version>, e.g. 'cartpole/daskrl-v0'.") from None


def _chunks(items: Iterator[tuple[EpisodeBuffer, dict[str, Any]]],
            ) -> Iterator[tuple[list[EpisodeBuffer], list[dict[str, Any]]]]:
    buffers: list[EpisodeBuffer] = []
    metas: list[dict[str, Any]] = []
    size = 0
    for buffer, meta in items:
        buffers.append(buffer)
        metas.append(meta)
        size += sum(a.nbytes for a in iter_leaves((buffer.observations, buffer.actions)))
        if size >= _CHUNK_BYTES:
            yield buffers, metas
            buffers, metas, size = [], [], 0
    if buffers:
        yield buffers, metas


@contextlib.contextmanager
def _datasets_root(data_path: str | os.PathLike[str] | None) -> Iterator[None]:
    """Minari finds its root in ``MINARI_DATASETS_PATH``; point it at ``data_path`` a while."""
    if data_path is None:
        yield
        return
    with _ROOT_LOCK:
        before = os.environ.get("MINARI_DATASETS_PATH")
        os.environ["MINARI_DATASETS_PATH"] = os.fspath(Path(data_path).absolute())
        try:
            yield
        finally:
            if before is None:
                del os.environ["MINARI_DATASETS_PATH"]
            else:
                os.environ["MINARI_DATASETS_PATH"] = before


@contextlib.contextmanager
def _quiet_nags() -> Iterator[None]:
    """Minari warns for each metadata field left unset; an export leaves them unset on purpose
    unless given (they are the caller's to give)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`(author|author_email|code_permalink|"
                                r"algorithm_name|description)` is set to None", category=UserWarning)
        yield


def _description(store: TrajectoryStore, settings: Mapping[int, Mapping[str, Any]],
                 cut: CutEpisodes, episodes: int, counts: Mapping[str, int]) -> str:
    from daskrl import __version__

    env = next(iter(settings.values())).get("env")
    text = (f"{episodes} episodes of {env}, exported by daskrl {__version__} from the store "
            f"{store.url}, run(s) {', '.join(map(str, sorted(settings)))}.")
    if cut == "truncate" and counts["truncate"]:
        text += (f" {counts['truncate']} episodes were still running when the collection "
                 "stopped: they end with truncations[-1] = True.")
    elif counts["drop"]:
        text += f" {counts['drop']} episodes still running when the collection stopped are left out."
    return text
