"""Policy weights as plain, versioned, checksummed CPU numpy arrays.

The learner's module may live on any device and hold any dtype.  :func:`snapshot` copies its
parameters and buffers (non-persistent ones included) into contiguous CPU numpy arrays —
``bfloat16`` and other dtypes numpy lacks are viewed as same-width integers and tagged with the
torch dtype — and computes one CRC32C per tensor.  Nothing device-side, no shared-memory storage
and no torch tensor is in a :class:`WeightsSnapshot`, so it pickles the same from ``cpu``,
``cuda`` or ``mps`` learners to spawn-started workers on any OS.

The module's *structure* travels separately and once, as a :class:`PolicySpec`: a copy whose
tensors live on the ``meta`` device (no data), rebuilt on the worker with ``to_empty``.
"""

from __future__ import annotations

import copy
import dataclasses
import pickletools
from collections.abc import Callable
from typing import Any

import google_crc32c
import numpy as np
import torch

from .errors import PolicyError, WeightsIntegrityError

__all__ = ["PolicySpec", "WeightsSnapshot", "load_weights", "policy_spec", "snapshot"]

PolicyLike = torch.nn.Module | Callable[[], torch.nn.Module]

_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise WeightsIntegrityError(f"unknown torch dtype {name!r} in a weights snapshot.")
    return dtype


def _crc(arr: np.ndarray) -> int:
    view = arr.reshape(-1).view(np.uint8)  # a view: no copy of the weights
    view.flags.writeable = False  # google_crc32c takes read-only buffers only
    return int(google_crc32c.value(view))


def _tensor_to_numpy(name: str, t: torch.Tensor, out: np.ndarray | None = None) -> np.ndarray:
    """A contiguous CPU numpy copy of ``t`` that shares no memory with it.

    ``out``, when given and of the right size and dtype, receives the copy (no new memory:
    fresh 100 MB allocations cost more in page faults than the copy itself).
    """
    if t.is_quantized or t.is_sparse or t.layout != torch.strided:
        raise PolicyError(
            f"tensor {name!r} has layout {t.layout} (quantized={t.is_quantized}); daskrl ships "
            "dense strided tensors only. Convert the policy to dense weights before collecting."
        )
    if t.device.type == "meta":
        raise PolicyError(f"tensor {name!r} is on the 'meta' device and holds no data.")
    t = t.detach().resolve_conj().resolve_neg()
    if out is not None:
        dst = torch.from_numpy(out)
        if dst.dtype != t.dtype:
            dst = dst.view(t.dtype)
        if dst.shape == t.shape:
            dst.copy_(t)
            return out
    if t.device.type == "cpu":
        c = t.clone(memory_format=torch.contiguous_format)
    else:
        c = t.to("cpu", copy=True).contiguous()
    try:
        return c.numpy()
    except TypeError:  # bfloat16, float8, ...: no numpy dtype of their own
        return c.view(_INT_OF_WIDTH[c.element_size()]).numpy()


def _named_tensors(module: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Canonical named parameters and buffers, and ``alias -> canonical`` for tied tensors."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[int, str] = {}
    named = list(module.named_parameters(remove_duplicate=False))
    named += list(module.named_buffers(remove_duplicate=False))
    for name, t in named:
        if id(t) in seen:
            aliases[name] = seen[id(t)]
        else:
            seen[id(t)] = name
            tensors[name] = t
    return tensors, aliases


@dataclasses.dataclass(frozen=True)
class WeightsSnapshot:
    """One version of a policy's weights, as plain CPU numpy arrays."""

    version: int
    """Increases by one with every :meth:`Collector.update_weights`."""
    names: tuple[str, ...]
    """Canonical parameter and buffer names, in module order."""
    dtypes: tuple[str, ...]
    """The torch dtype of each tensor (``"torch.bfloat16"``, ...)."""
    arrays: tuple[np.ndarray, ...]
    """Contiguous CPU arrays; dtypes numpy lacks are viewed as same-width integers."""
    checksums: tuple[int, ...]
    """CRC32C of each array's bytes, computed on the learner."""

    @property
    def nbytes(self) -> int:
        """Bytes of weight data in this version."""
        return sum(a.nbytes for a in self.arrays)

    def verify(self) -> None:
        """Raise :class:`WeightsIntegrityError` naming the first tensor whose bytes changed."""
        for name, arr, expected in zip(self.names, self.arrays, self.checksums):
            got = _crc(arr)
            if got != expected:
                raise WeightsIntegrityError(
                    f"weights version {self.version}: tensor {name!r} arrived with checksum "
                    f"{got:#010x}, the learner sent {expected:#010x}. The bytes were changed in "
                    "transit; the worker did not load them. Check the network/serialization "
                    "layer, then call update_weights() again."
                )

    def tensors(self) -> dict[str, torch.Tensor]:
        """The weights as CPU tensors in their torch dtypes (sharing memory with the arrays)."""
        out = {}
        for name, dtype, arr in zip(self.names, self.dtypes, self.arrays):
            t = torch.from_numpy(arr)
            td = _dtype_from_name(dtype)
            out[name] = t.view(td) if t.dtype != td else t
        return out


def snapshot(module: torch.nn.Module, version: int,
             reuse: WeightsSnapshot | None = None) -> WeightsSnapshot:
    """Copy ``module``'s parameters and buffers into a new :class:`WeightsSnapshot`.

    The copy is taken now: later in-place changes to the module do not reach it. ``reuse``
    lends the arrays of a snapshot nobody reads any more (overwritten, not reallocated).
    """
    tensors, _ = _named_tensors(module)
    spare = {}
    if reuse is not None:
        spare = {n: a for n, d, a in zip(reuse.names, reuse.dtypes, reuse.arrays)
                 if d == str(tensors[n].dtype)} if set(reuse.names) <= set(tensors) else {}
    names, dtypes, arrays, sums = [], [], [], []
    for name, t in tensors.items():
        arr = _tensor_to_numpy(name, t, spare.get(name))
        names.append(name)
        dtypes.append(str(t.dtype))
        arrays.append(arr)
        sums.append(_crc(arr))
    return WeightsSnapshot(version, tuple(names), tuple(dtypes), tuple(arrays), tuple(sums))


@dataclasses.dataclass(frozen=True)
class PolicySpec:
    """How a worker builds the policy: a data-free ``meta`` copy of the module, or a factory."""

    structure: torch.nn.Module | None
    factory: Callable[[], torch.nn.Module] | None
    aliases: tuple[tuple[str, str], ...]
    """``(alias, canonical)`` names of tied parameters/buffers, re-tied after ``to_empty``."""

    def build(self, device: torch.device | str) -> torch.nn.Module:
        """A fresh module on ``device`` (uninitialised until weights are loaded)."""
        if self.factory is not None:
            return self.factory().to(device).eval()
        assert self.structure is not None
        module = copy.deepcopy(self.structure).to_empty(device=device)
        for alias, canonical in self.aliases:
            target = _get_tensor(module, canonical)
            prefix, _, leaf = alias.rpartition(".")
            parent = module.get_submodule(prefix)
            if leaf in parent._parameters:
                parent._parameters[leaf] = target  # type: ignore[assignment]
            else:
                parent._buffers[leaf] = target
        return module.eval()


def _get_tensor(module: torch.nn.Module, name: str) -> torch.Tensor:
    prefix, _, leaf = name.rpartition(".")
    parent = module.get_submodule(prefix)
    t = parent._parameters.get(leaf)
    if t is None:
        t = parent._buffers.get(leaf)
    if t is None:
        raise PolicyError(f"the worker's policy has no parameter or buffer named {name!r}.")
    return t


def resolve_policy(
    policy: PolicyLike,
) -> tuple[torch.nn.Module, Callable[[], torch.nn.Module] | None]:
    """Return ``(module, factory)`` for a module or a zero-argument module factory."""
    if isinstance(policy, torch.nn.Module):
        return policy, None
    if callable(policy):
        module = policy()
        if not isinstance(module, torch.nn.Module):
            raise PolicyError(
                f"the policy factory {policy!r} returned {type(module).__name__}, expected a "
                "torch.nn.Module."
            )
        return module, policy
    raise PolicyError(
        f"policy must be a torch.nn.Module or a zero-argument factory returning one, got "
        f"{type(policy).__name__}."
    )


def policy_spec(
    module: torch.nn.Module, factory: Callable[[], torch.nn.Module] | None
) -> PolicySpec:
    """Describe how workers rebuild ``module``; check it can be pickled now, on the learner."""
    import cloudpickle

    _, aliases = _named_tensors(module)
    try:
        if factory is not None:
            structure = None
        else:
            memo: dict[int, Any] = {}
            for t in list(module.parameters()) + list(module.buffers()):
                meta = torch.empty_like(t, device="meta")
                if isinstance(t, torch.nn.Parameter):
                    meta = torch.nn.Parameter(meta, requires_grad=t.requires_grad)
                memo[id(t)] = meta
            structure = copy.deepcopy(module, memo)
        spec = PolicySpec(structure, factory, tuple(aliases.items()))
        payload = cloudpickle.dumps(spec)
    except Exception as e:
        what = "policy factory" if factory is not None else f"policy {type(module).__name__}"
        raise PolicyError(
            f"the {what} cannot be pickled to ship to workers ({type(e).__name__}: {e}). "
            "Pass a zero-argument factory that builds the module instead, e.g. "
            "policy=functools.partial(MyPolicy, hidden=64), defined in an importable module."
        ) from e
    leaked = _tensor_data_in(payload)
    if leaked:
        raise PolicyError(
            f"the policy {type(module).__name__} holds tensor data outside its parameters and "
            f"buffers (its pickle rebuilds {sorted(leaked)}), which would travel pickled to "
            "workers, device memory included. Register such tensors with register_buffer() "
            "(they then travel as checked numpy weights), or pass a factory."
        )
    return spec


_TENSOR_DATA_MARKERS = ("_rebuild_tensor", "rebuild_cuda", "rebuild_storage", "torch.storage",
                        "_share_", "rebuild_device_tensor", "rebuild_typed_storage")


def _tensor_data_in(payload: bytes) -> set[str]:
    """Names in a pickle stream that rebuild tensor *data* (storages), device or shared."""
    found = set()
    for _, arg, _ in pickletools.genops(payload):
        if isinstance(arg, str) and any(m in arg for m in _TENSOR_DATA_MARKERS):
            found.add(arg)
    return found


def load_weights(module: torch.nn.Module, weights: WeightsSnapshot) -> None:
    """Verify ``weights`` and copy them into ``module`` in place (any device)."""
    weights.verify()
    with torch.no_grad():
        for name, src in weights.tensors().items():
            dst = _get_tensor(module, name)
            if dst.shape != src.shape or dst.dtype != src.dtype:
                raise PolicyError(
                    f"weights version {weights.version}: tensor {name!r} is "
                    f"{tuple(src.shape)} {src.dtype}, but the worker's policy has "
                    f"{tuple(dst.shape)} {dst.dtype}. The policy's structure changed after "
                    "the collector started; make a new Collector for a new architecture."
                )
            dst.copy_(src)
