"""The envs' ``info``: entries named in ``info_keys`` as per-step arrays, and the episodes
``gymnasium.wrappers.RecordEpisodeStatistics`` reports.

:class:`InfoRecorder` takes each step's infos in either form gymnasium has: a list of ``E``
single-env dicts (``SingleEnvs`` steps single envs), or one vector-env dict whose entries are
arrays over the envs, each with its ``_<key>`` mask (``gymnasium.vector.VectorEnv``, envpool).
Entry ``<key>`` of a batch becomes the array ``info/<key>`` ``[T, E, ...]`` and its mask
``info/_<key>`` ``[T, E]`` (True where the env's info had the key at that step; the value is 0
elsewhere); an entry that is itself a dict (``episode``: ``{"r", "l", "t"}``) becomes one array
per sub-entry, ``info/<key>/<sub>``, under the one mask ``info/_<key>``.  Sub-entries named
``_<sub>`` are gymnasium's masks of a vector info and are not stored.

An entry's shape is fixed by the first time the stream's envs report it; dtypes promote
(``int`` then ``float`` values store as ``float64``).  A key no env reported in a batch, where
none ever had, a value of another shape, and a value that is not numeric raise
:class:`~daskrl.EnvInfoError` naming the key (and the env index and step).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from daskrl._nested import MAX_DEPTH, join
from daskrl.errors import EnvInfoError

__all__ = ["EPISODE_KEY", "INFO", "InfoRecorder", "InfoSpecs"]

INFO = "info"
"""The group info entries are stored under."""
EPISODE_KEY = "episode"
"""The entry ``RecordEpisodeStatistics`` adds at an episode's end: ``{"r", "l", "t"}``."""

InfoSpecs = dict[str, dict[str, tuple[tuple[int, ...], np.dtype]]]
"""Per key, the shape and dtype of each of its arrays (``""`` for a plain entry, the
sub-entry's path for a dict entry), as first reported (kept by the env set across batches)."""




class InfoRecorder:
    """One batch's info entries ``keys`` of ``n_envs`` envs over ``steps`` steps."""

    def __init__(self, keys: Sequence[str], steps: int, n_envs: int, *, env_name: str,
                 batch_id: int, specs: InfoSpecs | None = None) -> None:
        self.keys = tuple(keys)
        self.steps = steps
        self.n_envs = n_envs
        self.env_name = env_name
        self.batch_id = batch_id
        self.specs: InfoSpecs = specs if specs is not None else {}
        """Shapes and dtypes by key; pass the same dict to each batch of a stream."""
        self._values: dict[str, dict[str, np.ndarray]] = {}
        self._masks: dict[str, np.ndarray] = {}
        self._seen: set[str] = set()
        self.episodes: list[tuple[float, int, float]] = []
        """``(r, l, t)`` of each episode ``RecordEpisodeStatistics`` reported, in the order they
        ended (within a step, by env index)."""

    # -- per step ------------------------------------------------------------------------------
    def record(self, t: int | np.ndarray, infos: Sequence[Mapping[str, Any]] | Mapping[str, Any],
               envs: np.ndarray | Sequence[int] | None = None,
               done: np.ndarray | None = None) -> None:
        """Record one step's infos.

        ``infos``: a list of the ``E`` envs' info dicts, or a vector env's info dict (entries
        ``[E, ...]`` with ``_<key>`` masks).  ``t``: the row of every env, or an array of each
        env's row (``[E]``: a vector env whose envs are at different rows).  ``envs``: the env
        indices whose entries to take (default: all; a vector env's step that was no stored
        transition for some envs leaves them out).  ``done``: ``[E]`` bool, the envs whose
        episode ended at this step, whose ``episode`` entry (RecordEpisodeStatistics) goes to
        :attr:`episodes`.

        A vector env in gymnasium's ``SAME_STEP`` autoreset mode reports an ended env's step in
        ``info["final_info"]`` (``info`` itself holds its reset's): record ``info`` for the
        other envs and ``info["final_info"]`` for the ended ones (``envs=``), with ``done``.
        """
        if not self.keys and (done is None or not done.any()):
            return  # nothing to keep from this step (the common case: one check per step)
        if isinstance(infos, Mapping):
            idx = (np.arange(self.n_envs) if envs is None
                   else np.asarray(envs, np.int64).reshape(-1))
            rows = np.broadcast_to(np.asarray(t, np.int64), (self.n_envs,))
            self._seen.update(k for k in infos if not k.startswith("_"))
            for key in self.keys:
                if key in infos:
                    self._record_vector(key, infos, idx, rows)
            if done is not None:
                self._episodes_vector(infos, idx[done[idx]])
            return
        if len(infos) != self.n_envs:
            raise EnvInfoError(f"{len(infos)} infos for {self.n_envs} envs (batch "
                               f"{self.batch_id}, env {self.env_name}): pass one per env.")
        which = range(self.n_envs) if envs is None else [int(i) for i in envs]
        row = (np.broadcast_to(np.asarray(t, np.int64), (self.n_envs,)).tolist()
               if isinstance(t, np.ndarray) else [int(t)] * self.n_envs)
        if self.keys:
            for i in which:
                info = infos[i]
                if not info:
                    continue
                self._seen.update(info)
                for key in self.keys:
                    if key in info:
                        self._put(key, self._leaves(key, info[key], i, row[i]), i, row[i])
        if done is not None:
            self.episode_ends([i for i in which if done[i]], infos, row)

    def episode_ends(self, ended: Sequence[int], infos: Sequence[Mapping[str, Any]],
                     t: int | Sequence[int]) -> None:
        """Take the ``episode`` entries (``RecordEpisodeStatistics``) of the single envs
        ``ended``, whose episodes ended at step ``t`` (or at ``t[i]``), into :attr:`episodes`.
        :meth:`record` does this for its ``done`` envs; a caller with no ``keys`` calls it
        alone, at the steps where some episode ended."""
        for i in ended:
            info = infos[i]
            self._episode(info.get(EPISODE_KEY), info, i, t if isinstance(t, int) else t[i])

    def _leaves(self, key: str, value: Any, i: int, t: int, sub: str = "",
                depth: int = 2) -> dict[str, np.ndarray]:
        """``{sub-path: array}`` of one env's entry (``{"": array}`` for a plain one)."""
        if not isinstance(value, Mapping):
            return {sub: self._numeric(join(key, sub), value, i, t)}
        if depth >= MAX_DEPTH:
            raise self._error(join(key, sub), i, t, "nests dicts too deep to be stored")
        out: dict[str, np.ndarray] = {}
        for k, v in value.items():
            if isinstance(k, str) and k.startswith("_"):
                continue  # a vector info's mask of the sub-entry
            if not (isinstance(k, str) and k.isidentifier()):
                raise self._error(join(key, sub), i, t, f"has the entry {k!r}, whose name is "
                                  "not a Python identifier (it would name a stored array)")
            out.update(self._leaves(key, v, i, t, join(sub, k), depth + 1))
        if not out:
            raise self._error(join(key, sub), i, t, "is an empty dict")
        return out

    def _numeric(self, name: str, value: Any, i: int, t: int) -> np.ndarray:
        try:
            a = np.asarray(value)
        except ValueError:  # a sequence of sequences of different lengths
            raise self._error(name, i, t, f"is ragged ({_short(value)}): its entries differ "
                              "in shape") from None
        if a.dtype.kind not in "biuf":
            raise self._error(name, i, t, f"is {_short(value)} ({type(value).__name__}, dtype "
                              f"{a.dtype}), not a number, bool or numeric array")
        return a

    def _check_spec(self, key: str, leaves: Mapping[str, np.ndarray], i: int, t: int
                    ) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        spec = self.specs.get(key)
        if spec is None:
            spec = self.specs[key] = {s: (a.shape, a.dtype) for s, a in leaves.items()}
            return spec
        if set(leaves) != set(spec):
            raise self._error(key, i, t, f"has the entries {sorted(leaves)}, and earlier "
                              f"{sorted(spec)}: its shape varies")
        for s, a in leaves.items():
            shape, dtype = spec[s]
            if a.shape != shape:
                raise self._error(join(key, s), i, t, f"has shape {a.shape}, and earlier "
                                  f"{shape}: its shape varies (ragged)")
            if a.dtype != dtype:
                new = np.result_type(dtype, a.dtype)
                if new != dtype:
                    spec[s] = (shape, new)
                    if key in self._values:
                        self._values[key][s] = self._values[key][s].astype(new)
        return spec

    def _buffers(self, key: str, spec: Mapping[str, tuple[tuple[int, ...], np.dtype]]
                 ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        values = self._values.get(key)
        if values is None:
            values = self._values[key] = {
                s: np.zeros((self.steps, self.n_envs, *shape), dtype)
                for s, (shape, dtype) in spec.items()}
            self._masks[key] = np.zeros((self.steps, self.n_envs), np.bool_)
        return values, self._masks[key]

    def _put(self, key: str, leaves: Mapping[str, np.ndarray], i: int, t: int) -> None:
        spec = self._check_spec(key, leaves, i, t)
        values, mask = self._buffers(key, spec)
        for s, a in leaves.items():
            values[s][t, i] = a
        mask[t, i] = True

    def _record_vector(self, key: str, infos: Mapping[str, Any], idx: np.ndarray,
                       rows: np.ndarray) -> None:
        mask = infos.get("_" + key)
        present = idx if mask is None else idx[np.asarray(mask, np.bool_).reshape(-1)[idx]]
        if not len(present):
            return
        entry = infos[key]
        columns = self._vector_columns(key, entry, int(present[0]), int(rows[present[0]]))
        if any(a.dtype.kind not in "biuf" for a in columns.values()):  # find the bad env
            for i in present.tolist():
                one = _tree_row(entry, i)
                self._put(key, self._leaves(key, one, i, int(rows[i])), i, int(rows[i]))
            return
        i0, t0 = int(present[0]), int(rows[present[0]])
        spec = self._check_spec(key, {s: a[i0] for s, a in columns.items()}, i0, t0)
        values, m = self._buffers(key, spec)
        r = rows[present]
        for s, a in columns.items():
            values[s][r, present] = a[present]
        m[r, present] = True

    def _vector_columns(self, key: str, entry: Any, i: int, t: int, sub: str = "",
                        depth: int = 2) -> dict[str, np.ndarray]:
        """``{sub-path: array [E, ...]}`` of a vector info's entry."""
        if isinstance(entry, Mapping):
            if depth >= MAX_DEPTH:
                raise self._error(join(key, sub), i, t, "nests dicts too deep to be stored")
            out: dict[str, np.ndarray] = {}
            for k, v in entry.items():
                if isinstance(k, str) and k.startswith("_"):
                    continue
                if not (isinstance(k, str) and k.isidentifier()):
                    raise self._error(join(key, sub), i, t, f"has the entry {k!r}, whose name "
                                      "is not a Python identifier (it would name a stored "
                                      "array)")
                out.update(self._vector_columns(key, v, i, t, join(sub, k), depth + 1))
            return out
        try:
            a = np.asarray(entry)
        except ValueError:
            a = np.empty(0, object)
        if a.ndim == 0 or a.shape[0] != self.n_envs:
            raise self._error(join(key, sub), i, t, f"has shape {a.shape} in the vector "
                              f"info, which must hold one entry per env ({self.n_envs}, ...)")
        return {sub: a}

    # -- RecordEpisodeStatistics --------------------------------------------------------------
    def _episode(self, ep: Any, info: Mapping[str, Any], i: int, t: int) -> None:
        if not isinstance(ep, Mapping) or not {"r", "l", "t"} <= set(ep):
            return  # no RecordEpisodeStatistics (or an "episode" entry of another meaning)
        try:
            self.episodes.append((float(ep["r"]), int(ep["l"]), float(ep["t"])))
        except (TypeError, ValueError):
            raise self._error(EPISODE_KEY, i, t, f"is {_short(ep)}, where "
                              "RecordEpisodeStatistics reports numbers r, l and t") from None

    def _episodes_vector(self, infos: Mapping[str, Any], ended: np.ndarray) -> None:
        ep = infos.get(EPISODE_KEY)
        if not isinstance(ep, Mapping) or not len(ended):
            return
        mask = infos.get("_" + EPISODE_KEY)
        for i in ended.tolist():
            if mask is None or bool(np.asarray(mask).reshape(-1)[i]):
                self._episode(_tree_row(ep, i), infos, i, -1)

    # -- the batch's arrays --------------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        """``{"info/<key>": [T, E, ...], "info/_<key>": [T, E]}`` of every key; raises
        :class:`~daskrl.EnvInfoError` for a key no env of this stream has reported yet."""
        out: dict[str, np.ndarray] = {}
        for key in self.keys:
            if key not in self._values:
                spec = self.specs.get(key)
                if spec is None:
                    raise EnvInfoError(
                        f"env {self.env_name}: no env reported the info entry {key!r} named in "
                        f"info_keys at any of the {self.steps} steps of batch {self.batch_id} "
                        f"({self.n_envs} envs), nor before; the entries they reported: "
                        f"{sorted(map(str, self._seen)) or 'none'}. Check the name (info_keys, "
                        "--info-keys). An entry an env reports only at some steps (say, at an "
                        "episode's end) must appear in each stream's first batch, which fixes "
                        "its shape: collect longer batches (frames_per_batch).")
                self._buffers(key, spec)
            for s, a in self._values[key].items():
                out[join(INFO, key, s)] = a
            out[join(INFO, "_" + key)] = self._masks[key]
        return out

    def _error(self, name: str, i: int, t: int, problem: str) -> EnvInfoError:
        at = f" at step {t}" if t >= 0 else ""
        return EnvInfoError(
            f"env {self.env_name} (env index {i}){at} of batch {self.batch_id}: its info entry "
            f"{name!r} {problem}. info_keys stores numeric entries of one fixed shape; drop "
            "the key from info_keys, or wrap the env to report it so.")


def _tree_row(entry: Any, i: int) -> Any:
    """Env ``i``'s value of a vector info entry (dicts of arrays, recursively)."""
    if isinstance(entry, Mapping):
        return {k: _tree_row(v, i) for k, v in entry.items() if not str(k).startswith("_")}
    return entry[i]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
