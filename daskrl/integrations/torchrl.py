"""TensorDict and TorchRL views of daskrl batches, and TorchRL replay buffers fed from a store.

Owns the mapping from a batch's arrays (``{key: tensor [T, E, ...]}``, time-major, as
:meth:`~daskrl.BatchHandle.load` returns them) to a :class:`tensordict.TensorDict` and to the
layout TorchRL's collectors produce (``docs/integrations/torchrl.md`` has the table).
``tensordict`` is imported on first use, never when :mod:`daskrl` is imported; without it the
functions raise :class:`~daskrl.MissingDependencyError` (``pip install "daskrl[torchrl]"``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from daskrl._nested import flatten
from daskrl.errors import MissingDependencyError, UsageError

if TYPE_CHECKING:
    from tensordict import TensorDict

    from daskrl.store._handles import BatchHandle
    from daskrl.store._store import TrajectoryStore

__all__ = ["TORCHRL_KEYS", "extend_replay_buffer", "tensordict_class", "to_tensordict",
           "to_torchrl"]

INSTALL = 'pip install "daskrl[torchrl]"'

REQUIRED = ("observation", "next_observation", "action", "reward", "terminated", "truncated")
"""The arrays :func:`to_torchrl` needs (every batch has them)."""

TORCHRL_KEYS: Mapping[str, Any] = {
    "observation": "observation",
    "action": "action",
    "next_observation": ("next", "observation"),
    "reward": ("next", "reward"),
    "terminated": ("next", "terminated"),
    "truncated": ("next", "truncated"),
    "episode_id": ("collector", "traj_ids"),
    "step": "step_count",
}
"""Where :func:`to_torchrl` puts each of a batch's arrays (policy outputs keep their names, at
the root; a recurrent policy's ``is_init`` and ``policy_state``: see :func:`to_torchrl`). It adds ``("next", "done")`` (``terminated | truncated``), ``("next",
"step_count")`` (``step + 1``) and the root ``done``/``terminated``/``truncated`` (all False,
as in a collector's output: the flags of the state a step starts from, after any reset)."""

_OWN_KEYS = frozenset({"observation", "action", "next", "collector", "done", "terminated",
                       "truncated", "step_count"})

STATE_KEY = "policy_state"
RECURRENT_STATE = "recurrent_state"
"""TorchRL's key of a recurrent module's state (``GRUModule``'s default; ``LSTMModule``'s are
``recurrent_state_h`` and ``recurrent_state_c``)."""
STATE_FORMS = ("first", "every_step")


def tensordict_class() -> type[TensorDict]:
    """``tensordict.TensorDict``, or :class:`~daskrl.MissingDependencyError` naming the extra."""
    try:
        from tensordict import TensorDict
    except ImportError as e:
        raise MissingDependencyError(
            f"TensorDict and TorchRL views of daskrl batches need the 'tensordict' package, "
            f"which is not installed ({e}): {INSTALL} (tensordict and torchrl)."
        ) from e
    return TensorDict


def _tensors(batch: Any, what: str) -> dict[str, Any]:
    """``batch``'s arrays as ``{name: tensor}``: a mapping or a flat TensorDict; the arrays of
    a Dict or Tuple space or of ``info`` as nested dicts (a tuple's keyed ``"0"``, ``"1"``...)."""
    if not hasattr(batch, "keys") or not hasattr(batch, "__getitem__"):
        raise UsageError(f"{what} takes a batch as handle.load() returns it ({{key: tensor "
                         f"[T, E, ...]}}, or a TensorDict of it), got {type(batch).__name__}.")
    keys = list(batch.keys())  # iterating a TensorDict would walk its first dimension
    if "next" in keys and not isinstance(batch["next"], torch.Tensor):
        raise UsageError(f"{what} takes a batch's arrays as {{name: tensor}}, and this one has "
                         "('next', ...) entries (it is in TorchRL's layout already). Pass what "
                         "handle.load() returns.")
    out: dict[str, Any] = {}
    for key in keys:
        value = _tree(batch[key])
        if not isinstance(key, str) or value is None:
            raise UsageError(
                f"{what} takes a batch's arrays as {{name: tensor}} (nested dicts and tuples of "
                f"tensors for structured spaces); its entry {key!r} is a "
                f"{type(batch[key]).__name__}. Pass what handle.load() returns."
            )
        out[key] = value
    return out


def _tree(value: Any) -> Any:
    """A tensor, or a nested mapping/tuple of them as nested dicts with string keys (None if
    anything else is in it)."""
    if isinstance(value, torch.Tensor):
        return value
    items = (value.items() if isinstance(value, Mapping)
             else enumerate(value) if isinstance(value, tuple) else None)
    if items is None:
        return None
    out = {str(k): _tree(v) for k, v in items}
    return out if out and all(v is not None for v in out.values()) else None


def _time_env(tree: Mapping[str, Any], what: str) -> tuple[int, int]:
    """The ``(T, E)`` every array starts with."""
    arrays: dict[str, torch.Tensor] = flatten(tree)
    if not arrays:
        raise UsageError(f"{what} got a batch with no arrays; load it without keys=, or with "
                         "keys= that name some of its arrays.")
    shapes = {k: tuple(v.shape[:2]) for k, v in arrays.items()}
    first, first_shape = next(iter(shapes.items()))
    for k, shape in shapes.items():
        if len(shape) < 2 or shape != first_shape:
            raise UsageError(
                f"{what} needs every array time-major [T, E, ...] with one (T, E); {k!r} has "
                f"shape {tuple(arrays[k].shape)} and {first!r} {tuple(arrays[first].shape)}."
            )
    return first_shape[0], first_shape[1]


def to_tensordict(batch: Mapping[str, torch.Tensor], *, batch_size: Sequence[int] | None = None,
                  device: torch.device | str | None = None) -> TensorDict:
    """A batch's arrays as one :class:`tensordict.TensorDict` of batch size ``[T, E]``.

    The same tensors under the same keys (the arrays of a Dict or Tuple space and of ``info``
    nested: ``td["observation", "desired_goal"]``, ``td["observation", "0"]``); ``device`` sets the TensorDict's device (moving tensors that are elsewhere).
    ``batch_size`` defaults to the arrays' shared ``(T, E)``.
    """
    td_class = tensordict_class()
    arrays = _tensors(batch, "to_tensordict")
    size = list(batch_size) if batch_size is not None else list(_time_env(arrays, "to_tensordict"))
    return td_class(arrays, batch_size=size, device=device)


def _one_hot(action: torch.Tensor, n: int) -> torch.Tensor:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UsageError(f"one_hot_actions must be the number of discrete actions (an int >= 1) "
                         f"or None, got {n!r}.")
    if action.dim() != 2 or action.dtype.is_floating_point or action.dtype == torch.bool:
        raise UsageError(
            f"one_hot_actions={n} needs the integer actions of a Discrete space ([T, E]); the "
            f"batch's action is {action.dtype} of shape {tuple(action.shape)}. Pass "
            "one_hot_actions=None to keep the actions as stored."
        )
    if action.numel() and (int(action.min()) < 0 or int(action.max()) >= n):
        raise UsageError(
            f"one_hot_actions={n}: the batch has actions from {int(action.min())} to "
            f"{int(action.max())}, outside range({n}). Pass the space's n (a Discrete space "
            "starting at 0)."
        )
    return torch.nn.functional.one_hot(action.long(), n)


def to_torchrl(batch: Mapping[str, torch.Tensor] | TensorDict, *, env_first: bool = False,
               one_hot_actions: int | None = None,
               device: torch.device | str | None = None,
               state_form: str | None = None) -> TensorDict:
    """A batch in the layout of TorchRL's collectors: a TensorDict with ``("next", ...)`` keys.

    ``batch`` is what :meth:`~daskrl.BatchHandle.load` returns (or its :func:`to_tensordict`).
    Keys: ``observation``, ``action``, ``("next", "observation")``,
    ``("next", "reward")``, ``("next", "terminated")``, ``("next", "truncated")``, ``("next",
    "done")`` (``terminated | truncated``), the root ``done``/``terminated``/``truncated`` (all
    False, as a collector's), ``step_count`` and ``("next", "step_count")`` (from ``step``),
    ``("collector", "traj_ids")`` (the ``episode_id``), and policy outputs under their own names;
    rewards and flags get TorchRL's trailing ``[..., 1]`` (see :data:`TORCHRL_KEYS`).

    ``env_first``: batch size ``[E, T]`` (contiguous), as TorchRL collectors over batched envs
    give it (``td.reshape(-1)`` then lists each env's steps in order, and value estimators such
    as GAE see time as the last batch dimension); time-major ``[T, E]`` otherwise.
    ``one_hot_actions=n``: the integer actions of a ``Discrete(n)`` space as TorchRL's one-hot
    encoding (``GymEnv``'s default; ``int64 [..., n]``), kept as stored otherwise (TorchRL's
    ``categorical_action_encoding=True``).  ``device``: the TensorDict's device.

    A recurrent policy's batch (``docs/recurrent.md``) comes in the layout of TorchRL's
    recurrent modules: ``is_init`` at the root, ``[..., 1]`` (as ``InitTracker`` gives it), and
    the state before each step under TorchRL's keys: a tensor state as ``recurrent_state``
    (``GRUModule``'s default), each entry ``name`` of a mapping state as
    ``recurrent_state_<name>`` (``{"h", "c"}``: ``LSTMModule``'s defaults).  A state of one
    trailing dimension (``[E, hidden]``, a ``GRUCell``'s) gets TorchRL's layer axis,
    ``[..., 1, hidden]``; others keep their trailing shape (``[E, num_layers, hidden]``).  A
    state stored before every step fills every row.  One stored once per batch (``[E, ...]``)
    is the state at ``t = 0``, and the other rows hold zeros: TorchRL's recurrent mode
    (``set_recurrent_mode(True)``) reads the state only at a sequence's first step and where
    ``is_init`` is set, where its modules start from zeros, so it replays the batch exactly
    when the policy's initial state is zeros (TorchRL's); stepping through the rows one at a
    time needs the state before every step.  ``state_form`` (``"first"`` or
    ``"every_step"``, the batch's ``policy_state`` attribute) says which form ``policy_state``
    has; None infers it from the shapes (and asks for it where ``T == E`` leaves both open).
    """
    td_class = tensordict_class()
    arrays = _tensors(batch, "to_torchrl")
    missing = [k for k in REQUIRED if k not in arrays]
    if missing:
        raise UsageError(
            f"to_torchrl needs the arrays {missing}, which this batch was loaded without (it "
            f"has {sorted(arrays)}); load it without keys=, or with keys= that include "
            f"{list(REQUIRED)}."
        )
    state = arrays.pop(STATE_KEY, None)
    T, E = _time_env(arrays, "to_torchrl")
    clash = sorted(_OWN_KEYS.intersection(arrays) - set(TORCHRL_KEYS))
    if state is not None:  # the state's keys are TorchRL's recurrent_state*
        clash += sorted(k for k in arrays if k.startswith(RECURRENT_STATE))
    if state is not None and "is_init" not in arrays:
        raise UsageError("to_torchrl got a batch with policy_state but no is_init; load it "
                         "with both (keys= without is_init leaves TorchRL's modules no way to "
                         "reset the state where episodes start).")
    if clash:
        raise UsageError(f"the batch has policy outputs named {clash}, which TorchRL's layout "
                         "uses for its own keys; rename them in the policy.")
    for k in ("reward", "terminated", "truncated"):
        if arrays[k].dim() != 2:
            raise UsageError(f"to_torchrl needs {k!r} as [T, E], got shape "
                             f"{tuple(arrays[k].shape)}.")
    for k in ("terminated", "truncated"):
        if arrays[k].dtype != torch.bool:
            raise UsageError(f"to_torchrl needs {k!r} as bool, got {arrays[k].dtype}.")
    if one_hot_actions is not None:
        if not isinstance(arrays["action"], torch.Tensor):
            raise UsageError(f"one_hot_actions={one_hot_actions} needs the integer actions of "
                             "a Discrete space; this batch's actions are a Dict or Tuple "
                             "space's. Pass one_hot_actions=None.")
        arrays["action"] = _one_hot(arrays["action"], one_hot_actions)

    terminated = arrays.pop("terminated").unsqueeze(-1)
    truncated = arrays.pop("truncated").unsqueeze(-1)
    nxt: dict[str, torch.Tensor] = {
        "observation": arrays.pop("next_observation"),
        "reward": arrays.pop("reward").unsqueeze(-1),
        "done": terminated | truncated,
        "terminated": terminated,
        "truncated": truncated,
    }
    root: dict[str, Any] = {
        "observation": arrays.pop("observation"),
        "action": arrays.pop("action"),
        "done": torch.zeros_like(terminated),
        "terminated": torch.zeros_like(terminated),
        "truncated": torch.zeros_like(truncated),
    }
    if "step" in arrays:
        step = arrays.pop("step").unsqueeze(-1)
        root["step_count"] = step
        nxt["step_count"] = step + 1
    if "episode_id" in arrays:
        root["collector"] = {"traj_ids": arrays.pop("episode_id")}
    if state is not None:
        root["is_init"] = arrays.pop("is_init").unsqueeze(-1)
        root.update(_recurrent_state(state, T, E, state_form))
    root.update(arrays)  # policy outputs, as stored
    root["next"] = nxt
    if env_first:
        root = _env_first(root)
    return td_class(root, batch_size=[E, T] if env_first else [T, E], device=device)


def _recurrent_state(state: Any, T: int, E: int, form: str | None) -> dict[str, torch.Tensor]:
    """A batch's ``policy_state`` (a tensor, or ``{name: tensor}``) under TorchRL's keys, each
    ``[T, E, ...]`` (see :func:`to_torchrl`)."""
    leaves = {"": state} if isinstance(state, torch.Tensor) else flatten(state)
    if form is None:
        forms = {_form(t, T, E) for t in leaves.values()}
        if forms != {"first"} and forms != {"every_step"}:
            shapes = {k or STATE_KEY: tuple(t.shape) for k, t in leaves.items()}
            raise UsageError(
                f"to_torchrl cannot tell from its shapes {shapes} whether the batch's "
                f"policy_state ([T, E] = [{T}, {E}]) is stored once, [E, ...], or before "
                "every step, [T, E, ...]: pass state_form='first' or 'every_step' (the "
                "batch's policy_state attribute, store.records()[batch_id]['policy_state']).")
        form = forms.pop()
    elif form not in STATE_FORMS:
        raise UsageError(f"state_form must be one of {STATE_FORMS} or None, got {form!r}.")
    out = {}
    for name, t in leaves.items():
        lead = (E,) if form == "first" else (T, E)
        if tuple(t.shape[:len(lead)]) != lead:
            raise UsageError(f"to_torchrl: policy_state{'/' + name if name else ''} has shape "
                             f"{tuple(t.shape)}, not {list(lead)} + [...] as state_form="
                             f"{form!r} and the batch's [T, E] = [{T}, {E}] make it.")
        if form == "first":
            rows = t.new_zeros((T, *t.shape))
            rows[0] = t
            t = rows
        if t.dim() == 3:
            t = t.unsqueeze(2)  # TorchRL's layer axis: [T, E, 1, hidden]
        out[f"{RECURRENT_STATE}_{name.replace('/', '_')}" if name else RECURRENT_STATE] = t
    return out


def _form(t: torch.Tensor, T: int, E: int) -> str | None:
    """The form a state array's shape says, None if both or neither fit."""
    once = t.dim() >= 1 and t.shape[0] == E
    every = t.dim() >= 2 and tuple(t.shape[:2]) == (T, E)
    return None if once == every else "first" if once else "every_step"


def _env_first(tree: dict[str, Any]) -> dict[str, Any]:
    return {k: _env_first(v) if isinstance(v, dict) else v.transpose(0, 1).contiguous()
            for k, v in tree.items()}


def _batches(source: Any, keys: Sequence[str] | None, device: torch.device | str | None,
             ) -> Iterator[dict[str, torch.Tensor]]:
    from daskrl.store._handles import BatchHandle
    from daskrl.store._store import TrajectoryStore, open_store

    if isinstance(source, (str, os.PathLike)):
        source = open_store(source)
    if isinstance(source, TrajectoryStore):  # batches deleted while reading are skipped
        for _handle, batch in source.iter_batches(keys, device=device):
            yield batch
        return
    if isinstance(source, BatchHandle):
        source = [source]
    if not isinstance(source, Iterable):
        raise UsageError(f"extend_replay_buffer reads a store (an open store or its URL), a "
                         f"BatchHandle or handles, got {type(source).__name__}.")
    for handle in source:
        if not isinstance(handle, BatchHandle):
            raise UsageError(f"extend_replay_buffer got a {type(handle).__name__} among its "
                             "handles; pass BatchHandles (e.g. those a Collector hands over).")
        yield handle.load(device, keys)


def extend_replay_buffer(
    rb: Any,
    source: TrajectoryStore | BatchHandle | Iterable[BatchHandle] | str | os.PathLike[str],
    *,
    keys: Sequence[str] | None = None,
    one_hot_actions: int | None = None,
    device: torch.device | str | None = None,
) -> int:
    """Add every transition of ``source``'s batches to a TorchRL replay buffer; return how many.

    ``rb``: a ``torchrl.data.ReplayBuffer`` (e.g. ``TensorDictReplayBuffer(storage=
    LazyTensorStorage(n))``). ``source``: a store (an open :class:`~daskrl.TrajectoryStore` or a
    local store's URL: its committed batches, by id), one :class:`~daskrl.BatchHandle`, or
    handles (e.g. each handle a :class:`~daskrl.Collector` hands over). Each batch is put in
    TorchRL's layout (:func:`to_torchrl`, env-first) and flattened to ``[E * T]``, so each env's
    steps lie in order and ``("collector", "traj_ids")`` tells episodes apart (what
    ``SliceSampler(traj_key=("collector", "traj_ids"))`` needs). ``keys`` selects arrays (it
    must include those :func:`to_torchrl` needs); ``device`` is where batches are loaded to.
    """
    if not callable(getattr(rb, "extend", None)):
        raise UsageError(f"extend_replay_buffer needs a TorchRL replay buffer (with .extend), "
                         f"got {type(rb).__name__}.")
    tensordict_class()  # a missing extra fails before any read
    added = 0
    for batch in _batches(source, keys, device):
        flat = to_torchrl(batch, env_first=True, one_hot_actions=one_hot_actions).reshape(-1)
        rb.extend(flat)
        added += flat.numel()
    return added
