"""A policy's output on a worker: split into the action and extra outputs, and checked.

The learner runs these checks once on its sample observations, and each batch on its first
step: the action must fit the env's action space for ``E`` envs, extra outputs must have a
storable name and the envs first.  Errors are :class:`~daskrl.PolicyError` naming what to fix.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from daskrl._nested import iter_leaves
from daskrl.errors import PolicyError
from daskrl.worker._spaces import SpaceLayout

__all__ = ["RESERVED_KEYS", "OutputReader", "check_action", "check_extras", "describe",
           "policy_error", "split_policy_output", "to_numpy"]


def split_policy_output(out: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """``(action, extras)`` from a policy's output: a tensor, a tuple of tensors (the action
    of a ``Tuple`` action space, as gymnasium's vector envs take it), or a dict with
    ``"action"`` (for a ``Dict`` or ``Tuple`` action space, ``"action"`` is a dict or tuple
    of tensors)."""
    if isinstance(out, (torch.Tensor, tuple)):
        return out, {}
    if isinstance(out, Mapping):
        if "action" not in out:
            raise PolicyError(
                f"the policy returned a mapping with keys {sorted(out)}, which lacks 'action'. "
                "Return a tensor, or a dict with an 'action' entry plus extra outputs (for a "
                "Dict action space too: {'action': {key: tensor, ...}, ...})."
            )
        extras = {}
        for k, v in out.items():
            if k == "action":
                if not isinstance(v, torch.Tensor) and not all(
                        isinstance(x, torch.Tensor) for x in iter_leaves(v)):
                    raise PolicyError(f"policy output 'action' is {describe(v)}, expected a "
                                      "tensor (or, for a Dict or Tuple action space, a dict or "
                                      "tuple of tensors).")
                continue
            if not isinstance(v, torch.Tensor):
                raise PolicyError(f"policy output {k!r} is {type(v).__name__}, expected a tensor.")
            extras[str(k)] = v
        return out["action"], extras
    raise PolicyError(
        f"the policy returned {type(out).__name__}; expected an action tensor [E, *action] (a "
        "tuple of them for a Tuple action space) or a dict {'action': ..., other per-step "
        "outputs}."
    )


def check_action(action: Any, space: gym.Space, n_envs: int, env_name: str) -> None:
    """Raise :class:`PolicyError` unless ``action`` fits ``space`` for ``n_envs`` envs (a
    ``Dict`` or ``Tuple`` space: a dict or tuple of tensors, each fitting its entry)."""
    if isinstance(action, tuple) and not isinstance(space, spaces.Tuple):
        raise PolicyError(
            f"policy output 'action' is a tuple {describe(action)}: a tuple is the action of a "
            f"Tuple action space, but env {env_name} has the action space {space!r}. Return "
            "the action as a tensor, and any extra outputs in a dict {'action': ..., "
            "'log_prob': ...}."
        )
    layout = SpaceLayout(space)
    try:
        parts = layout.split(action)
    except ValueError as e:
        raise PolicyError(f"policy output 'action' is {e}: env {env_name} has the action "
                          f"space {space!r}.") from None
    for leaf, part in zip(layout.leaves, parts):
        if not isinstance(part, torch.Tensor):
            raise PolicyError(f"policy output {leaf.label('action')} is "
                              f"{type(part).__name__}, expected a tensor.")
        _check_leaf_action(part, leaf.space, n_envs, env_name, leaf.label("action"))


def _check_leaf_action(action: torch.Tensor, space: gym.Space, n_envs: int, env_name: str,
                       what: str) -> None:
    expected = (n_envs, *space.shape)  # type: ignore[misc]
    if tuple(action.shape) != expected:
        raise PolicyError(
            f"policy output {what!r} has shape {tuple(action.shape)}, but env {env_name} has "
            f"action space {space!r}: expected {expected} for {n_envs} envs."
        )
    integral = isinstance(space, (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary))
    if integral and action.dtype.is_floating_point:
        raise PolicyError(
            f"policy output {what!r} has dtype {action.dtype}, but env {env_name} has the "
            f"discrete action space {space!r}: return integer actions (e.g. argmax or sample)."
        )
    if isinstance(space, spaces.Box) and not (
        action.dtype.is_floating_point or space.dtype.kind in "iu"
    ):
        raise PolicyError(
            f"policy output {what!r} has dtype {action.dtype}; env {env_name} has the "
            f"continuous action space {space!r}: return floating-point actions."
        )
    if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete)):
        a = action.detach().cpu().numpy()
        low = space.start
        high = space.start + (space.n if isinstance(space, spaces.Discrete) else space.nvec)
        if np.any(a < low) or np.any(a >= high):
            raise PolicyError(
                f"policy output {what!r} has values outside env {env_name}'s action space "
                f"{space!r} (got min {a.min()}, max {a.max()})."
            )


def describe(x: Any) -> str:
    """``tensor (8, 4) float32 on cpu``, or a dict or tuple of such, for messages."""
    if isinstance(x, torch.Tensor):
        return f"tensor {tuple(x.shape)} {x.dtype} on {x.device}"
    if isinstance(x, Mapping):
        return "{" + ", ".join(f"{k!r}: {describe(v)}" for k, v in x.items()) + "}"
    if isinstance(x, tuple):
        return "(" + ", ".join(describe(v) for v in x) + ("," if len(x) == 1 else "") + ")"
    return f"a {type(x).__name__}"


RESERVED_KEYS = frozenset({"observation", "next_observation", "action", "reward", "terminated",
                           "truncated", "episode_id", "step", "info", "policy_state", "is_init"})


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU numpy array of a policy output; bfloat16 (no numpy dtype) becomes float32.

    It may share memory with ``t``: callers copy it into their buffers at once.
    """
    if t.is_cpu and t.dtype != torch.bfloat16 and not t.requires_grad:
        return t.numpy()
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.cpu().numpy()


def check_extras(extras: Mapping[str, torch.Tensor], n_envs: int) -> None:
    """Raise :class:`PolicyError` unless every extra output has a storable name and the envs
    first (``[n_envs, ...]``). Run on the learner's sample output and on each batch's first."""
    for name, v in extras.items():
        if name in RESERVED_KEYS or not name.isidentifier():
            raise PolicyError(
                f"the policy returned an extra output named {name!r}; extra outputs are stored "
                f"under their own names, which must be identifiers other than "
                f"{sorted(RESERVED_KEYS)}. Rename it."
            )
        if tuple(v.shape[:1]) != (n_envs,):
            raise PolicyError(
                f"policy output {name!r} has shape {tuple(v.shape)}; per-step outputs must have "
                f"the envs first: ({n_envs}, ...)."
            )


def policy_error(e: BaseException, env_name: str, t: int, batch_id: int,
                  obs: Any) -> PolicyError:
    """A :class:`PolicyError` for a policy that raised while collecting, with its traceback in
    the message (exception chains do not survive pickling from a Dask worker)."""
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip()
    return PolicyError(
        f"the policy raised at step {t} of batch {batch_id} on the observations of env "
        f"{env_name} ({describe(obs)}): {e!r}. It ran on "
        "the learner's sample observations: check what differs on the worker (its files, "
        "environment variables, device, or the env's real observations)."
        f"\n--- the policy's traceback, on the worker ---\n{tb}"
    )


class OutputReader:
    """A rollout's reader of the policy's outputs, per step, as numpy arrays.

    The first output is checked in full (:func:`check_action`, :func:`check_extras`); each
    later one of the same form (a flat action space, a tensor or a dict with the first's keys,
    CPU tensors) is read without the general path's conversions, and any other takes that
    path, which names what is wrong with it."""

    def __init__(self, first: Any, space: gym.Space, n_envs: int, env_name: str) -> None:
        action, extras = split_policy_output(first)
        check_action(action, space, n_envs, env_name)
        check_extras(extras, n_envs)
        self.layout = SpaceLayout(space)
        self._tensor = isinstance(first, torch.Tensor)
        self._keys = first.keys() if type(first) is dict else None
        self._extra_names = tuple(extras)

    def __call__(self, out: Any) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
        """``(action leaves, extras)`` of one step's output, each ``[E, ...]`` (they may share
        memory with the output: copy them at once)."""
        if not self.layout.structured:
            try:
                if self._tensor and type(out) is torch.Tensor:
                    return [out.numpy()], {}
                if self._keys is not None and type(out) is dict and out.keys() == self._keys:
                    return [out["action"].numpy()], {k: out[k].numpy() for k in self._extra_names}
            except (AttributeError, TypeError, RuntimeError):
                pass  # not a CPU tensor without grad: the general path converts or names it
        action, extras = split_policy_output(out)
        return ([to_numpy(a) for a in self.layout.split(action)],
                {k: to_numpy(v) for k, v in extras.items()})
