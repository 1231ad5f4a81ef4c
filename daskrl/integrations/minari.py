"""Minari export: a store's episodes written as a `Minari <https://minari.farama.org>`_ dataset,
the Farama Foundation's offline-RL format, so that ``minari.load_dataset`` and the tools built on
it read them.  Needs the ``minari`` extra (``pip install "daskrl[minari]"``: minari and h5py).

This module owns the mapping from daskrl's episodes to Minari's (which episodes go, with what
flags), the env spec the dataset records, and where it is written; the data is read from the
store, never collected again.  See ``docs/integrations/minari.md``.
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
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from daskrl._nested import iter_leaves, tree_map
from daskrl.data._episodes import iter_episodes
from daskrl.errors import ConfigError, ExportExistsError, MissingDependencyError
from daskrl.store._layout import run_of
from daskrl.store._store import TrajectoryStore, open_store

if TYPE_CHECKING:
    import gymnasium as gym
    from gymnasium.envs.registration import EnvSpec
    from minari import MinariDataset
    from minari.data_collector import EpisodeBuffer

__all__ = ["CutEpisodes", "MinariExport", "export_minari"]

CutEpisodes = Literal["drop", "truncate"]
"""What happens to an episode that was still running when its stream's last batch was written
(or that ``reset_at_each_iter`` cut at a batch's end): left out, or exported with
``truncations[-1] = True``."""

_KEYS = ("observation", "next_observation", "action", "reward")
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
    settings = _select_runs(st, runs)
    spec = _env_spec(settings, env, env_kwargs)
    obs_space, act_space = _spaces(spec)
    with _datasets_root(data_path):
        target = Path(minari.storage.get_dataset_path(dataset_id))
    if target.exists() and not overwrite:
        raise _exists(dataset_id, target)

    counts = {"drop": 0, "truncate": 0, "partial": 0}
    episodes = _buffers(st, settings, cut, obs_space, act_space, counts)
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


def _select_runs(store: TrajectoryStore, runs: int | Collection[int] | None,
                 ) -> dict[int, dict[str, Any]]:
    """``{run: settings}`` of the runs to export."""
    recorded = store.runs()
    if not recorded:
        raise ConfigError(f"the store {store.url!r} has no run to export.")
    if runs is None:
        wanted = sorted(recorded)
    else:
        wanted = sorted({runs} if isinstance(runs, int) else set(runs))
        missing = [r for r in wanted if r not in recorded]
        if missing or not wanted:
            raise ConfigError(f"the store {store.url!r} has no run {missing or wanted}; its runs "
                              f"are {sorted(recorded)}.")
    settings = {r: dict(recorded[r].get("settings", {})) for r in wanted}
    envs = {r: s.get("env") for r, s in settings.items()}
    several = sorted(r for r, env in envs.items() if isinstance(env, list))
    if several:
        raise ConfigError(
            f"run {several[0]} of {store.url!r} collected several envs ({envs[several[0]]}); "
            "a Minari dataset holds one env: export runs of one env.")
    if len(set(envs.values())) > 1:
        raise ConfigError(
            f"the runs of {store.url!r} collected different envs ({envs}); a Minari dataset "
            "holds one env: export one env's runs (runs=..., --run N).")
    return settings


def _env_spec(settings: Mapping[int, Mapping[str, Any]], env: str | EnvSpec | None,
              env_kwargs: Mapping[str, Any] | None) -> EnvSpec:
    """The spec the dataset records: ``env`` (or the runs' id) with ``env_kwargs``, and the
    runs' episode limit."""
    import gymnasium as gym
    from gymnasium.envs.registration import EnvSpec

    recorded = next(iter(settings.values())).get("env")
    given = env if env is not None else recorded
    if isinstance(given, EnvSpec):
        spec = given
    elif isinstance(given, str):
        try:
            if ":" in given:  # "module:Env-v0", as gymnasium.make takes it
                module, given = given.split(":", 1)
                importlib.import_module(module)
            spec = gym.spec(given)
        except (gym.error.Error, ImportError) as e:
            where = "" if env is not None else (
                " (the env the runs recorded: a factory's name, or an id whose package is not "
                "imported)")
            raise ConfigError(
                f"cannot find the gymnasium env {given!r}{where}: {e} Pass the registered id "
                "of the env the data was collected from (env=..., --env ID).") from None
    else:
        raise ConfigError(f"env must be a gymnasium id or EnvSpec, got {type(given).__name__}.")
    if env_kwargs:
        spec = dataclasses.replace(spec, kwargs={**spec.kwargs, **env_kwargs})
    limits = []
    for s in settings.values():  # the collector's TimeLimit sits on top of the env's own
        pair = [n for n in (spec.max_episode_steps, s.get("max_frames_per_traj")) if n]
        limits.append(min(pair) if pair else None)
    limit = None if None in limits else max(limits)  # type: ignore[type-var]
    return dataclasses.replace(spec, max_episode_steps=limit)


def _spaces(spec: EnvSpec) -> tuple[gym.Space, gym.Space]:
    import gymnasium as gym

    try:
        e = gym.make(spec)
    except Exception as err:
        raise ConfigError(f"cannot make the env {spec.id!r} to read its spaces: "
                          f"{type(err).__name__}: {err}") from None
    try:
        return e.observation_space, e.action_space
    finally:
        e.close()


def _buffers(store: TrajectoryStore, settings: Mapping[int, Any], cut: CutEpisodes,
             obs_space: gym.Space, act_space: gym.Space, counts: dict[str, int],
             ) -> Iterator[tuple[EpisodeBuffer, dict[str, Any]]]:
    """Minari episode buffers and their metadata, in the order the episodes ended."""
    from minari.data_collector import EpisodeBuffer

    checked = False
    for ep in iter_episodes(store, (*_KEYS, "step"), complete_only=False,
                            only_runs=set(settings)):
        steps = ep.data["step"].numpy()
        if not np.array_equal(steps, np.arange(len(steps))):
            counts["partial"] += 1  # its first or middle steps were in deleted batches
            continue
        if not ep.complete and cut == "drop":
            counts["drop"] += 1
            continue
        # nested (dicts, tuples) for Dict and Tuple spaces, as Minari takes them too
        d = {k: tree_map(lambda v: v.numpy(), ep.data[k])
             for k in (*_KEYS, "terminated", "truncated")}
        if not checked:
            _check_fits(d, obs_space, act_space)
            checked = True
        truncations = d["truncated"].copy()
        if not ep.complete:
            counts["truncate"] += 1
            truncations[-1] = True
        buffer = EpisodeBuffer(
            observations=_with_last(d["observation"], d["next_observation"]),
            actions=d["action"], rewards=d["reward"], terminations=d["terminated"],
            truncations=truncations, infos={})
        meta = {"daskrl_episode_id": ep.episode_id, "daskrl_run": run_of(ep.batch_ids[0]),
                "daskrl_batch_ids": np.asarray(ep.batch_ids, dtype=np.int64),
                "daskrl_cut": not ep.complete}
        yield buffer, meta


def _with_last(obs: Any, nxt: Any) -> Any:
    """An episode's observations and its last ``next_observation`` (leaf by leaf)."""
    if isinstance(obs, Mapping):
        return {k: _with_last(v, nxt[k]) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(_with_last(v, n) for v, n in zip(obs, nxt))
    return np.concatenate([obs, nxt[-1:]])


def _check_fits(d: Mapping[str, Any], obs_space: gym.Space, act_space: gym.Space,
                ) -> None:
    from daskrl.worker._spaces import SpaceLayout

    problems = []
    for what, data, space in (("observations", d["observation"], obs_space),
                              ("actions", d["action"], act_space)):
        layout = SpaceLayout(space)
        try:
            parts = layout.split(data)
        except ValueError:
            problems.append(f"{what} {type(data).__name__} vs the space {space}")
            continue
        for leaf, a in zip(layout.leaves, parts):
            if not isinstance(a, np.ndarray):
                problems.append(f"{what} {type(a).__name__} vs the space {space}")
            elif a.shape[1:] != leaf.shape or (what == "observations" and a.dtype != leaf.dtype):
                where = f"{what}{'' if not leaf.path else ' ' + leaf.path}"
                problems.append(f"{where} {a.dtype}{list(a.shape[1:])} vs the "
                                f"{'observation' if what == 'observations' else 'action'} "
                                f"space {leaf.space if leaf.path else space}")
    if problems:
        raise ConfigError(
            f"the stored data does not fit the env's spaces: {'; '.join(problems)}. Pass the env "
            "the data was collected from (env=..., --env) and its env_kwargs (--env-kwargs).")


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
