"""Recurrent policies: the contract, its checks, and the state a stream's envs carry.

A policy is *recurrent* when it has ``initial_state(num_envs)``, which returns a tensor or a
mapping ``{name: tensor}``, each ``[num_envs, ...]``. Its ``forward(obs, state)`` then returns
``(output, new_state)``: ``output`` is what a stateless policy returns (an action, or a dict
with ``"action"`` and extra outputs), ``new_state`` has the initial state's structure, shapes
and dtypes. :func:`is_recurrent` is the one test of it, on the learner
(:func:`check_recurrent`, before any worker starts) and on workers (:class:`PolicyState`).

A batch of a recurrent policy stores ``policy_state`` (``policy_state/<name>`` for a mapping):
the state before the batch's first step, ``[E, ...]``, or with ``store_policy_state=
"every_step"`` the state before every step, ``[T, E, ...]``; and ``is_init`` ``[T, E]``, the
rows that are their episode's first step (where the state was reset to the initial one).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from daskrl.errors import PolicyError
from daskrl.worker._policy_output import describe, to_numpy

__all__ = ["IS_INIT_KEY", "STATE_KEY", "STORE_MODES", "PolicyState", "check_recurrent",
           "is_recurrent", "state_names"]

STATE_KEY = "policy_state"
"""The array (a tensor state) or group (a mapping) of a batch's stored state."""
IS_INIT_KEY = "is_init"
"""The array ``[T, E]`` of the rows that are their episode's first step."""
STORE_MODES = ("first", "every_step")
"""``store_policy_state``: the state before a batch's first step, or before every step."""

Spec = tuple[tuple[str, tuple[int, ...], torch.dtype], ...]
"""A state's leaves: ``(name, shape, dtype)`` each (name ``""`` for a tensor state)."""

_CONTRACT = ("A recurrent policy (one with initial_state(num_envs)) has forward(obs, state) "
             "return (output, new_state), new_state of initial_state's structure, shapes and "
             "dtypes.")


def is_recurrent(policy: Any) -> bool:
    """Whether ``policy`` is recurrent: it has a callable ``initial_state``."""
    return callable(getattr(policy, "initial_state", None))


def _initial_state(policy: Any, n_envs: int) -> Any:
    """``policy.initial_state(n_envs)``, unchecked."""
    return policy.initial_state(n_envs)


def state_names(spec: Spec) -> list[str]:
    """The stored array names of a state's leaves: ``policy_state``, or
    ``policy_state/<name>`` for each entry of a mapping."""
    return [f"{STATE_KEY}/{name}" if name else STATE_KEY for name, _, _ in spec]


def _leaves(state: Any, what: str) -> list[tuple[str, torch.Tensor]]:
    """``[("", tensor)]`` or ``[(name, tensor), ...]`` of a state; PolicyError otherwise."""
    if isinstance(state, torch.Tensor):
        return [("", state)]
    if isinstance(state, Mapping) and state and all(
            isinstance(v, torch.Tensor) for v in state.values()):
        for k in state:
            if not isinstance(k, str) or not k.isidentifier():
                raise PolicyError(
                    f"{what} is a mapping with the key {k!r}; its entries are stored as "
                    "policy_state/<name>, so their names must be identifiers. Rename it.")
        return list(state.items())
    raise PolicyError(f"{what} is {describe(state)}; a policy's state is a tensor "
                      "[num_envs, ...] or a non-empty mapping {name: tensor [num_envs, ...]}.")


def _label(name: str) -> str:
    return f"state entry {name!r}" if name else "state"


def _check_initial(state: Any, n_envs: int) -> Spec:
    """The spec of ``initial_state(n_envs)``'s result, checked: envs first."""
    what = f"the policy's initial_state({n_envs})"
    spec = []
    for name, t in _leaves(state, what):
        if t.dim() == 0 or t.shape[0] != n_envs:
            raise PolicyError(
                f"{what} gave a {_label(name)} of shape {tuple(t.shape)}: a state has the envs "
                f"first, [num_envs, ...] = ({n_envs}, ...). Size it by its num_envs argument.")
        if t.dtype.is_complex or not (t.dtype.is_floating_point or t.dtype in _INTEGRAL):
            raise PolicyError(f"{what} gave a {_label(name)} of dtype {t.dtype}; a state is "
                              "stored, so it must be of a numeric or bool dtype.")
        spec.append((name, tuple(t.shape), t.dtype))
    return tuple(spec)


_ROW_COPIES = 4
"""Up to this many rows, :meth:`PolicyState.reset` copies row by row: a copy between two
row views allocates nothing and takes a third of the time of an indexed assignment, which
converts the index and gathers the initial rows into a new tensor first."""

_INTEGRAL = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _check_new(state: Any, spec: Spec, n_envs: int, when: str) -> None:
    """Raise PolicyError unless ``state`` (a new state, ``when`` names the step) fits ``spec``."""
    what = f"the new state forward(obs, state) returned {when}"
    leaves = _leaves(state, what)
    names = [n for n, _, _ in spec]
    if sorted(n for n, _ in leaves) != sorted(names):
        got = describe(state)
        raise PolicyError(f"{what} is {got}, but initial_state({n_envs}) gave "
                          f"{'a tensor' if names == [''] else 'entries ' + repr(names)}. "
                          f"{_CONTRACT}")
    expected = {n: (shape, dtype) for n, shape, dtype in spec}
    for name, t in leaves:
        shape, dtype = expected[name]
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise PolicyError(
                f"{what} has a {_label(name)} of shape {tuple(t.shape)} and dtype {t.dtype}, but "
                f"initial_state({n_envs}) gave shape {shape} and dtype {dtype}: a state keeps "
                "its shape and dtype from step to step. " + _CONTRACT)


def _split(result: Any, spec: Spec, n_envs: int, when: str) -> tuple[Any, Any]:
    """``(output, new_state)`` of a recurrent forward's ``result``, checked."""
    if not isinstance(result, tuple) or len(result) != 2:
        raise PolicyError(
            f"the policy's forward(obs, state) returned {describe(result)} {when}, one value "
            f"where two were expected. {_CONTRACT}")
    _check_new(result[1], spec, n_envs, when)
    return result


def _on(state: Any, device: torch.device) -> Any:
    """``state`` on ``device``, as tensors of their own (contiguous, writable)."""
    if isinstance(state, torch.Tensor):
        return state.to(device).clone(memory_format=torch.contiguous_format)
    return {k: v.to(device).clone(memory_format=torch.contiguous_format)
            for k, v in state.items()}


def check_recurrent(module: torch.nn.Module, obs: Any, n_envs: int,
                    device: torch.device) -> Any:
    """Run a recurrent ``module`` on ``obs`` (``n_envs`` sample observations) for two steps
    from its initial state, checking the contract; return the first step's output (to be
    checked as a stateless policy's is)."""
    try:
        inspect.signature(module.forward).bind(obs, None)
    except TypeError:
        raise PolicyError(
            f"the policy {type(module).__name__} has initial_state(), so it is taken as "
            "recurrent, but its forward takes no state argument. " + _CONTRACT + " Give "
            "forward a state argument, or remove initial_state.") from None
    except ValueError:  # no signature to inspect (a builtin): the call below tells
        pass
    with torch.inference_mode():
        init = _initial_state(module, n_envs)
    spec = _check_initial(init, n_envs)
    state = _on(init, device)
    outputs = []
    for when in ("at its first step", "at its second step"):
        try:
            with torch.inference_mode():
                result = module(obs, state)
        except Exception as e:
            raise PolicyError(
                f"the recurrent policy raised {when} on a batch of {n_envs} sample "
                f"observations ({describe(obs)}) and the state {describe(state)}: "
                f"{type(e).__name__}: {e}") from e
        output, state = _split(result, spec, n_envs, when)
        outputs.append(output)
    return outputs[0]


class PolicyState:
    """A stream's recurrent state on its worker's device, one row per env: carried from step
    to step and from batch to batch (whatever weights version runs the batch), and reset to
    ``initial_state``'s rows for the envs whose episode starts.

    A batch calls :meth:`begin`, steps the policy through :meth:`bind`, calls :meth:`reset`
    where episodes end, and takes its arrays from :meth:`arrays`."""

    def __init__(self, n_envs: int, every_step: bool = False) -> None:
        self.n_envs = n_envs
        self.every_step = every_step
        self.state: Any = None
        """The state before the next step (None: every env starts from the initial state)."""
        self.spec: Spec = ()
        self._init: list[torch.Tensor] = []
        self._first: dict[str, np.ndarray] = {}
        self._bufs: list[torch.Tensor] = []
        self._t = 0
        self._check = True

    def clear(self) -> None:
        """Every env starts a new episode: the next batch starts from the initial state."""
        self.state = None

    def leaves(self) -> list[torch.Tensor]:
        """The current state's tensors, in :attr:`spec` order."""
        state = self.state
        if isinstance(state, torch.Tensor):
            return [state]
        return [state[name] for name, _, _ in self.spec]

    def begin(self, policy: torch.nn.Module, device: torch.device, steps: int,
              record: bool = True) -> None:
        """Start a batch of ``steps`` steps run by ``policy`` (its weights may be new: they
        take over the carried state). ``record``: keep what :meth:`arrays` returns (a loop
        that stores the state itself passes False)."""
        with torch.inference_mode():
            init = _initial_state(policy, self.n_envs)
            spec = _check_initial(init, self.n_envs)
            if self.spec and spec != self.spec:
                raise PolicyError(
                    f"the policy's initial_state({self.n_envs}) gave {describe(init)} with "
                    f"these weights, but the stream's state has leaves {self.spec}: a state "
                    "keeps its shape and dtype from weights version to version.")
            self.spec = spec
            init = _on(init, device)
            self._init = [init] if isinstance(init, torch.Tensor) else [
                init[name] for name, _, _ in spec]
            if self.state is None:
                self.state = _on(init, device)
            else:
                _check_new(self.state, spec, self.n_envs, "at the previous batch's last step")
            self._check = True
            self._t = 0
            self._bufs, self._first = [], {}
            if record and self.every_step:
                self._bufs = [torch.empty((steps, *shape), dtype=dtype, device=device)
                              for _, shape, dtype in spec]
            elif record:  # the one copy of the state a batch stores
                self._first = {n: to_numpy(t).copy() if t.is_cpu else to_numpy(t)
                               for n, t in zip(state_names(spec), self.leaves())}

    def bind(self, policy: torch.nn.Module) -> Callable[[Any], Any]:
        """``policy`` as a stateless one: ``act(obs)`` runs ``policy(obs, state)``, keeps the
        new state and returns the output (call it under ``torch.inference_mode``)."""
        bufs = self._bufs

        def act(obs: Any) -> Any:
            if bufs:
                t = self._t
                for buf, leaf in zip(bufs, self.leaves()):
                    buf[t].copy_(leaf)
                self._t = t + 1
            result = policy(obs, self.state)
            if self._check:
                result = _split(result, self.spec, self.n_envs, "at a batch's first step")
                self._check = False
            output, self.state = result
            return output

        return act

    def reset(self, envs: list[int] | np.ndarray) -> None:
        """The episodes of ``envs`` start at the next step: their rows of the state become
        the initial state's, copied in place."""
        if isinstance(envs, np.ndarray):
            envs = envs.tolist()
        with torch.inference_mode():
            for leaf, init in zip(self.leaves(), self._init):
                if len(envs) > _ROW_COPIES:
                    leaf[envs] = init[envs]
                    continue
                for i in envs:
                    leaf[i].copy_(init[i])

    def arrays(self) -> dict[str, np.ndarray]:
        """The batch's stored state: ``[E, ...]`` before its first step, or, recorded in
        ``every_step`` mode, ``[T, E, ...]`` before each step."""
        if self._bufs:
            return {n: to_numpy(b) if b.is_cpu else to_numpy(b.cpu())
                    for n, b in zip(state_names(self.spec), self._bufs)}
        return self._first
