"""Policy weights as plain, versioned, checksummed CPU numpy arrays.

The learner's module may live on any device and hold any dtype.  :func:`snapshot` copies its
parameters and buffers (non-persistent ones included) into contiguous CPU numpy arrays —
``bfloat16`` and other dtypes numpy lacks are viewed as same-width integers and tagged with the
torch dtype — and computes one CRC32C per tensor.  Nothing device-side, no shared-memory storage
and no torch tensor is in a :class:`WeightsSnapshot`, so it pickles the same from ``cpu``,
``cuda`` or ``mps`` learners to spawn-started workers on any OS.

The module's *structure* travels separately and once, as a :class:`PolicySpec`: a copy whose
tensors live on the ``meta`` device (no data), rebuilt empty on the worker's device.
"""

from __future__ import annotations

import copy
import dataclasses
import pickletools
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from daskrl._checksums import crc32c
from daskrl.errors import PolicyError, WeightsIntegrityError

__all__ = ["PolicySpec", "WeightsSnapshot", "load_weights", "policy_spec", "snapshot"]

PolicyLike = torch.nn.Module | Callable[[], torch.nn.Module]

_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def dtype_from_name(name: str) -> torch.dtype:
    """The torch dtype a snapshot names (``"torch.bfloat16"``); an error for anything else."""
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise WeightsIntegrityError(f"unknown torch dtype {name!r} in a weights snapshot.")
    return dtype


def _crc(arr: np.ndarray) -> int:
    return crc32c(_bytes(arr))


def _bytes(arr: np.ndarray) -> np.ndarray:
    """A flat ``uint8`` view of a contiguous array; no copy."""
    return arr.reshape(-1).view(np.uint8)


CRC_BLOCK = 1 << 20
"""Bytes copied, then checksummed while still in the CPU cache (one pass over memory)."""


def copy_with_crc(dst: np.ndarray, src: np.ndarray) -> int:
    """Copy the bytes of contiguous ``src`` into ``dst`` block by block and return the CRC32C
    of what landed in ``dst`` (each block is read back while it is cached)."""
    d, s = _bytes(dst), _bytes(src)
    crc = 0
    for i in range(0, d.size, CRC_BLOCK):
        np.copyto(d[i:i + CRC_BLOCK], s[i:i + CRC_BLOCK])
        crc = crc32c(d[i:i + CRC_BLOCK], crc)
    return crc


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype a tensor of ``dtype`` is stored as (same-width integers for dtypes
    numpy lacks, such as ``bfloat16``)."""
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except TypeError:
        return torch.empty(0, dtype=_INT_OF_WIDTH[dtype.itemsize]).numpy().dtype


def weights_layout(module: torch.nn.Module) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    """``(name, torch dtype, shape)`` of every tensor a snapshot of ``module`` holds, in order."""
    tensors, _ = _named_tensors(module)
    return tuple((n, str(t.dtype), tuple(t.shape)) for n, t in tensors.items())


def _tensor_to_numpy(name: str, t: torch.Tensor,
                     out: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """A contiguous CPU numpy copy of ``t`` that shares no memory with it, and its CRC32C.

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
    if out is not None and out.shape == tuple(t.shape) and out.dtype == numpy_dtype(t.dtype):
        if t.device.type == "cpu" and t.is_contiguous():
            return out, copy_with_crc(out, as_numpy(t))
        dst = torch.from_numpy(out)
        (dst.view(t.dtype) if dst.dtype != t.dtype else dst).copy_(t)
        return out, _crc(out)
    if t.device.type == "cpu":
        c = t.clone(memory_format=torch.contiguous_format)
    else:
        c = t.to("cpu", copy=True).contiguous()
    arr = as_numpy(c)
    return arr, _crc(arr)


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """``t`` (on the CPU) as a numpy array sharing its memory."""
    try:
        return t.numpy()
    except TypeError:  # bfloat16, float8, ...: no numpy dtype of their own
        return t.view(_INT_OF_WIDTH[t.element_size()]).numpy()


def _named_tensors(module: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Canonical named parameters and buffers, and ``alias -> canonical`` for tied tensors."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[int, str] = {}
    named: list[tuple[str, torch.Tensor]] = list(module.named_parameters(remove_duplicate=False))
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
        """The weights as CPU tensors in their torch dtypes (sharing memory with the arrays;
        read-only arrays, e.g. read from the store, give tensors that are only read from)."""
        out = {}
        for name, dtype, arr in zip(self.names, self.dtypes, self.arrays):
            if arr.flags.writeable:
                t = torch.from_numpy(arr)
            else:
                with warnings.catch_warnings():  # torch warns that it cannot protect them
                    warnings.simplefilter("ignore", UserWarning)
                    t = torch.from_numpy(arr)
            td = dtype_from_name(dtype)
            out[name] = t.view(td) if t.dtype != td else t
        return out


def snapshot(module: torch.nn.Module, version: int,
             out: Mapping[str, np.ndarray] | None = None) -> WeightsSnapshot:
    """Copy ``module``'s parameters and buffers into a new :class:`WeightsSnapshot`.

    The copy is taken now: later in-place changes to the module do not reach it. ``out`` lends
    arrays by tensor name (those of a snapshot nobody reads any more, or of a shared-memory
    segment): a tensor whose array matches its shape and dtype is copied into it, not into
    new memory.
    """
    tensors, _ = _named_tensors(module)
    spare = out or {}
    names, dtypes, arrays, sums = [], [], [], []
    for name, t in tensors.items():
        arr, crc = _tensor_to_numpy(name, t, spare.get(name))
        names.append(name)
        dtypes.append(str(t.dtype))
        arrays.append(arr)
        sums.append(crc)
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
        # What ``to_empty`` does, but from the meta tensors' sizes and strides (dense: they are
        # ``empty_like`` copies): ``empty_like`` of a meta tensor runs torch's Python reference
        # implementation, whose first call imports sympy (~1 s of every worker's start-up).
        module: torch.nn.Module = copy.deepcopy(self.structure)._apply(
            lambda t: torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=device))
        for alias, canonical in self.aliases:
            target = get_tensor(module, canonical)
            prefix, _, leaf = alias.rpartition(".")
            parent = module.get_submodule(prefix)
            if leaf in parent._parameters:
                parent._parameters[leaf] = target  # type: ignore[assignment]
            else:
                parent._buffers[leaf] = target
        return module.eval()


def get_tensor(module: torch.nn.Module, name: str) -> torch.Tensor:
    """The parameter or buffer ``name`` (dotted) of ``module`` itself, not a copy."""
    prefix, _, leaf = name.rpartition(".")
    parent = module.get_submodule(prefix)
    t: torch.Tensor | None = parent._parameters.get(leaf)
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
            dst = get_tensor(module, name)
            if dst.shape != src.shape or dst.dtype != src.dtype:
                raise PolicyError(
                    f"weights version {weights.version}: tensor {name!r} is "
                    f"{tuple(src.shape)} {src.dtype}, but the worker's policy has "
                    f"{tuple(dst.shape)} {dst.dtype}. The policy's structure changed after "
                    "the collector started; make a new Collector for a new architecture."
                )
            dst.copy_(src)
