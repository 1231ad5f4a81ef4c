"""Selecting batches by the env they came from (``store.handles(env=...)``, ``iter_batches``,
``episodes``): an env index (a commit record's ``env``; 0 in records without one), an env's
label as its run's settings name it (``settings["envs"][index]``, or ``settings["env"]`` in
records written before ``envs`` was added), or a collection of those."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from daskrl.errors import UsageError
from daskrl.store._layout import run_of

__all__ = ["EnvFilter", "env_label", "env_matcher"]

EnvFilter = int | str | Collection[int | str] | None
"""An env index, an env label (``"CartPole-v1"``, ``"module.make_env"``), or a collection of
them; None selects every batch."""


def env_label(settings: Mapping[str, Any], index: int) -> str | None:
    """The label of env ``index`` in a run's ``settings`` (None if the record does not say)."""
    labels = settings.get("envs")
    if isinstance(labels, list) and 0 <= index < len(labels) and isinstance(labels[index], str):
        return labels[index]
    env = settings.get("env")
    return env if index == 0 and isinstance(env, str) else None


def _check(value: Any) -> int | str:
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)
                                  and value >= 0):
        return value
    raise UsageError(f"env= selects by env index (an int >= 0) or env label (a str), or a "
                     f"collection of them; got {value!r}.")


def env_matcher(selector: EnvFilter, runs: Callable[[], Mapping[int, Mapping[str, Any]]],
                ) -> Callable[[Mapping[str, Any]], bool] | None:
    """A test of commit records for ``selector`` (None: no test). ``runs`` gives the store's run
    records, asked for only when a label is to be matched."""
    if selector is None:
        return None
    if isinstance(selector, (str, int)):
        wanted = {_check(selector)}
    else:
        try:
            values = list(selector)
        except TypeError:
            _check(selector)  # raises: neither an index, a label nor a collection
            raise
        wanted = {_check(v) for v in values}
    indices = {v for v in wanted if isinstance(v, int)}
    labels = {v for v in wanted if isinstance(v, str)}
    settings: dict[int, Mapping[str, Any]] = {}
    if labels:
        settings = {r: rec.get("settings", {}) for r, rec in runs().items()}

    def match(rec: Mapping[str, Any]) -> bool:
        index = int(rec.get("env", 0))
        if index in indices:
            return True
        if not labels:
            return False
        return env_label(settings.get(run_of(int(rec["batch_id"])), {}), index) in labels

    return match
