"""What a collection's settings are made of, checked on the learner before anything starts
and used on the workers: the device setting, environment variables, info keys and wrapper
specs.

A leaf: it imports no daskrl package but ``errors``, and neither torch nor gymnasium when it is
imported, so that ``daskrl.config`` (and the CLI's start) stays light and ``config`` and
``worker`` both use it without importing each other. Applying wrappers and resolving devices
happen on the workers (``worker/_wrappers.py``, ``worker/_devices.py``).
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from daskrl.errors import ConfigError, WrapperError

__all__ = ["DeviceSetting", "WrapperSpec", "check_device_setting", "check_env_vars",
           "check_info_keys", "parse_wrapper", "parse_wrappers"]

if TYPE_CHECKING:
    import torch

    DeviceSetting = str | torch.device | Mapping[str, str]
else:  # torch is imported where a device is checked, not with this module (the CLI's start)
    DeviceSetting = Any


def check_device_setting(device: DeviceSetting) -> DeviceSetting:
    """Validate a device setting on the learner (syntax only: workers have their own devices)."""
    if isinstance(device, Mapping):
        out = {}
        for name, d in device.items():
            out[str(name)] = str(check_device_setting(d))
        return out
    text = str(device)
    if text == "auto":
        return text
    import torch

    try:
        torch.device(text)
    except (RuntimeError, TypeError) as e:
        raise ConfigError(
            f"device {device!r} is not a torch device; use 'auto', 'cpu', 'cuda', 'cuda:N', "
            "'mps', or a mapping {worker name: device}."
        ) from e
    return text


def check_env_vars(env_vars: Mapping[str, Any]) -> dict[str, str]:
    """Validate ``env_vars``: string names, values that can be strings."""
    out = {}
    for k, v in env_vars.items():
        if not k or "=" in k:
            raise ConfigError(f"env_vars has an invalid variable name {k!r}.")
        if not isinstance(v, (str, int, float)) or isinstance(v, bool):
            raise ConfigError(f"env_vars[{k!r}] must be a string or number, got {v!r}.")
        out[k] = str(v)
    return out


def check_info_keys(keys: Any) -> tuple[str, ...]:
    """``info_keys`` as a tuple of distinct names, each an identifier that does not start with
    ``_`` (``_<key>`` names the masks); raises :class:`ValueError` saying what is wrong."""
    if isinstance(keys, str):
        keys = (keys,)
    if not isinstance(keys, (list, tuple)) or not all(isinstance(k, str) for k in keys):
        raise ValueError(f"info_keys must be a sequence of strings, got {keys!r}")
    for k in keys:
        if not k.isidentifier() or k.startswith("_"):
            raise ValueError(
                f"info_keys has {k!r}: info keys name stored arrays info/<key> (their masks "
                "info/_<key>), so each must be a Python identifier not starting with '_'")
    return tuple(dict.fromkeys(keys))


_GRAMMAR = ("a wrapper spec is 'package.module.Wrapper' or 'package.module.Wrapper:KEY=VALUE,"
            "KEY=VALUE' with Python literals as values, e.g. "
            "'gymnasium.wrappers.FrameStackObservation:stack_size=4'")


@dataclasses.dataclass(frozen=True)
class WrapperSpec:
    """One wrapper: the import path of a callable and its keyword arguments."""

    path: str
    """Dotted import path, e.g. ``"gymnasium.wrappers.TimeLimit"``."""
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments (Python literals) the wrapper is called with after the env."""

    @property
    def text(self) -> str:
        """The canonical spec (what run records store): ``path[:key=repr(value),...]``."""
        if not self.kwargs:
            return self.path
        return self.path + ":" + ",".join(f"{k}={v!r}" for k, v in self.kwargs.items())


def _literal_kwargs(text: str, spec: str) -> dict[str, Any]:
    if not text.strip():
        raise WrapperError(f"wrapper spec {spec!r} has nothing after ':'; {_GRAMMAR}.")
    try:
        call = ast.parse(f"f({text})", mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        call = None
    if (not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name) or call.args
            or any(kw.arg is None for kw in call.keywords)):
        raise WrapperError(f"wrapper spec {spec!r}: {text!r} is not KEY=VALUE pairs separated "
                           f"by commas; {_GRAMMAR}.")
    out: dict[str, Any] = {}
    for kw in call.keywords:
        assert kw.arg is not None
        if kw.arg in out:
            raise WrapperError(f"wrapper spec {spec!r} gives {kw.arg!r} twice.")
        try:
            out[kw.arg] = ast.literal_eval(kw.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise WrapperError(
                f"wrapper spec {spec!r}: the value of {kw.arg!r} ({ast.unparse(kw.value)!r}) is "
                f"not a Python literal; quote text ({kw.arg}='...'). For arguments that are "
                "not literals (functions, spaces), wrap the env in a factory instead.") from None
    return out


def parse_wrapper(spec: str | WrapperSpec) -> WrapperSpec:
    """Parse one spec (see the module docstring); raises :class:`WrapperError`."""
    if isinstance(spec, WrapperSpec):
        return spec
    if not isinstance(spec, str):
        raise WrapperError(f"a wrapper must be given as a spec string, got "
                           f"{type(spec).__name__}: {spec!r}; {_GRAMMAR}. Apply wrappers that "
                           "are Python objects in an env factory.")
    path, sep, rest = spec.strip().partition(":")
    path = path.strip()
    parts = path.split(".")
    if len(parts) < 2 or not all(p.isidentifier() for p in parts):
        raise WrapperError(f"wrapper spec {spec!r}: {path!r} is not a dotted import path of a "
                           f"wrapper; {_GRAMMAR}.")
    return WrapperSpec(path, _literal_kwargs(rest, spec) if sep else {})


def parse_wrappers(specs: Any) -> tuple[WrapperSpec, ...]:
    """Parse a sequence of specs (one string is one spec)."""
    if specs is None:
        return ()
    if isinstance(specs, (str, WrapperSpec)):
        specs = [specs]
    if not isinstance(specs, (list, tuple)):
        raise WrapperError(f"wrappers must be a list of wrapper specs, got "
                           f"{type(specs).__name__}: {specs!r}; {_GRAMMAR}.")
    return tuple(parse_wrapper(s) for s in specs)
