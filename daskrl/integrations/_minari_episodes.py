"""What a Minari export takes from a store: the runs (of one env), the env spec and spaces the
dataset records, and each episode as a Minari ``EpisodeBuffer`` with its metadata and flags."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Collection, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from daskrl._nested import tree_map
from daskrl.data._episodes import iter_episodes
from daskrl.errors import ConfigError
from daskrl.store._layout import run_of
from daskrl.store._store import TrajectoryStore

if TYPE_CHECKING:
    import gymnasium as gym
    from gymnasium.envs.registration import EnvSpec
    from minari.data_collector import EpisodeBuffer

__all__ = ["CutEpisodes", "env_spaces", "env_spec", "episode_buffers", "select_runs"]

CutEpisodes = Literal["drop", "truncate"]
"""What happens to an episode that was still running when its stream's last batch was written
(or that ``reset_at_each_iter`` cut at a batch's end): left out, or exported with
``truncations[-1] = True``."""

_KEYS = ("observation", "next_observation", "action", "reward")


def select_runs(store: TrajectoryStore, runs: int | Collection[int] | None,
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


def env_spec(settings: Mapping[int, Mapping[str, Any]], env: str | EnvSpec | None,
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


def env_spaces(spec: EnvSpec) -> tuple[gym.Space, gym.Space]:
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


def episode_buffers(store: TrajectoryStore, settings: Mapping[int, Any], cut: CutEpisodes,
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
