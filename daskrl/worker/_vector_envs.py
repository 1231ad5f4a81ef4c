"""What the vector rollout needs to know about a ``gymnasium.vector.VectorEnv``.

Its autoreset mode, whether it can reset some of its sub-envs alone
(``reset(options={"reset_mask": mask})``), how it takes its first seeds, how to step it with a
deadline, and which sub-env an error came from.  The vector env's checked calls are in
:mod:`daskrl.worker._vector`, the loops that step it in :mod:`daskrl.worker._rollout` and
:mod:`daskrl.worker._vector_staggered`.

Private parts of gymnasium and envpool read here (and nowhere else): ``AsyncVectorEnv``'s
``parent_pipes`` (the one it closed after a sub-process's error) and ``shared_memory``, the
loop variable ``i`` of ``SyncVectorEnv.step``/``reset`` in a traceback, and envpool's
``GymnasiumEnvPoolMixin`` and ``config``.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from daskrl.errors import EnvError

__all__ = ["AutoresetMode", "autoreset_mode", "building_seed", "check_batch", "check_envpool",
           "close_vector", "env_seed", "failed_index", "first_seed", "is_async", "is_timeout",
           "resets_one", "step_vector", "vector_action"]

_building = threading.local()


@contextlib.contextmanager
def building_seed(seed: int) -> Iterator[None]:
    """While daskrl builds a stream's env in this thread, :func:`env_seed` returns ``seed``."""
    previous = getattr(_building, "seed", None)
    _building.seed = seed
    try:
        yield
    finally:
        _building.seed = previous


def env_seed(default: int = 0) -> int:
    """The seed daskrl gives the vector env it is building now, in this thread.

    For env factories whose env takes its seed when it is made rather than in ``reset``, such
    as envpool: ``lambda: envpool.make_gymnasium("Pong-v5", num_envs=8,
    seed=daskrl.env_seed())`` gives every stream's pool a seed of its own, derived from the
    collection's ``seed`` and the stream as ``docs/reproducibility.md`` says (a non-negative
    31-bit int, as envpool takes). Outside such a
    build (the learner's probe of the env, say) it returns ``default``.
    """
    seed = getattr(_building, "seed", None)
    return default if seed is None else int(seed)


def autoreset_mode(venv: gym.vector.VectorEnv, name: str) -> AutoresetMode:
    """The vector env's autoreset mode (``metadata["autoreset_mode"]``); gymnasium's default,
    ``NEXT_STEP``, where it declares none."""
    mode = (getattr(venv, "metadata", None) or {}).get("autoreset_mode", AutoresetMode.NEXT_STEP)
    if isinstance(mode, AutoresetMode):
        return mode
    try:
        return AutoresetMode(getattr(mode, "value", mode))
    except ValueError:
        choices = ", ".join(repr(m.value) for m in AutoresetMode)
        raise EnvError(f"env {name}: its metadata['autoreset_mode'] is {mode!r}; expected a "
                       f"gymnasium.vector.AutoresetMode ({choices}).") from None


def _is_envpool(venv: Any) -> bool:
    module = sys.modules.get("envpool.python.gymnasium_envpool")  # imported if venv is one
    mixin = getattr(module, "GymnasiumEnvPoolMixin", None)
    return mixin is not None and isinstance(venv, mixin)


def is_async(venv: gym.vector.VectorEnv) -> bool:
    """Whether the (unwrapped) vector env is gymnasium's ``AsyncVectorEnv``."""
    return isinstance(venv.unwrapped, AsyncVectorEnv)


def resets_one(venv: gym.vector.VectorEnv) -> bool:
    """Whether ``reset(options={"reset_mask": mask})`` resets the masked sub-envs alone, so
    that the next step is a real step for them whatever the autoreset mode.

    True for gymnasium's ``SyncVectorEnv`` and ``AsyncVectorEnv`` from gymnasium 1.1 (those
    with an ``autoreset_mode``; an ``AsyncVectorEnv`` with ``shared_memory=False`` forgets the
    reset in ``NEXT_STEP`` mode, so not that one), and for envpool. Other vector envs (e.g.
    ``vector_entry_point`` envs such as ``CartPoleVectorEnv``, which resets every sub-env) are
    taken not to.
    """
    base = venv.unwrapped
    if isinstance(base, SyncVectorEnv):
        return hasattr(base, "autoreset_mode")
    if isinstance(base, AsyncVectorEnv):
        return hasattr(base, "autoreset_mode") and bool(base.shared_memory)
    return _is_envpool(base)


def first_seed(venv: gym.vector.VectorEnv, seeds: list[int], vector_seed: int) -> Any:
    """The ``seed`` of the vector env's first ``reset``: one per sub-env for gymnasium's own
    vector envs (the seeds single envs get), none for envpool (seeded when made: see
    :func:`env_seed`), ``vector_seed`` for any other vector env (one seed for all)."""
    base = venv.unwrapped
    if isinstance(base, (SyncVectorEnv, AsyncVectorEnv)):
        return list(seeds)
    if _is_envpool(base):
        return None
    return vector_seed


def check_envpool(venv: gym.vector.VectorEnv, name: str) -> None:
    """Refuse an envpool in asynchronous mode (``batch_size < num_envs``): its steps return a
    different subset of sub-envs each time."""
    base: Any = venv.unwrapped
    if _is_envpool(base) and getattr(base, "is_async", False):
        raise EnvError(
            f"env {name} is an envpool in asynchronous mode (batch_size="
            f"{base.config['batch_size']} < num_envs={base.config['num_envs']}): daskrl steps "
            "every sub-env each step. Make it without batch_size (or batch_size=num_envs)."
        )


def vector_action(space: gym.Space, action: np.ndarray) -> np.ndarray:
    """A batch of actions ``[E, ...]`` as the vector env takes it: Box clipped to the single
    space's bounds, every kind in the space's dtype."""
    if isinstance(space, spaces.Box):
        return np.clip(action, space.low, space.high).astype(space.dtype, copy=False)
    return action.astype(space.dtype, copy=False)


def step_vector(venv: gym.vector.VectorEnv, actions: np.ndarray, timeout: float | None) -> Any:
    """``venv.step(actions)``; for an unwrapped ``AsyncVectorEnv``, waited for at most
    ``timeout`` seconds (``multiprocessing.TimeoutError`` past it). An error raised here carries
    the failed sub-process's traceback, when gymnasium reported one, as ``e.daskrl_trace``."""
    if not isinstance(venv, AsyncVectorEnv):
        return venv.step(actions)
    # AsyncVectorEnv reports a sub-process's error (index, traceback) as warnings, then
    # raises a bare copy of the exception: keep the traceback for the error message.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            venv.step_async(actions)
            result = venv.step_wait(timeout=timeout)
        except Exception as e:
            trace = [str(w.message) for w in caught if "Traceback" in str(w.message)]
            e.daskrl_trace = trace[-1] if trace else None  # type: ignore[attr-defined]
            raise
    for w in caught:  # anything else is passed on
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return result


def failed_index(venv: gym.vector.VectorEnv, e: BaseException) -> int | None:
    """The sub-env ``e`` came from, where the vector env tells: the loop variable of
    ``SyncVectorEnv.step``/``reset`` in the traceback, or the pipe ``AsyncVectorEnv`` closed
    after the sub-process's error. None for other vector envs."""
    base = venv.unwrapped
    if isinstance(base, AsyncVectorEnv):
        pipes = getattr(base, "parent_pipes", None) or []
        failed = [i for i, pipe in enumerate(pipes) if pipe is None]
        return failed[-1] if failed else None  # gymnasium raises the last error
    if isinstance(base, SyncVectorEnv):
        tb = e.__traceback__
        index = None
        while tb is not None:
            frame = tb.tb_frame
            if frame.f_code.co_filename.endswith("sync_vector_env.py"):
                i = frame.f_locals.get("i")
                if isinstance(i, int):
                    index = i
            tb = tb.tb_next
        return index
    return None


def close_vector(venv: gym.vector.VectorEnv, broken: bool) -> None:
    """Close the vector env; an ``AsyncVectorEnv`` left mid-call (a step past its deadline)
    has its sub-processes terminated rather than waited for."""
    if broken and isinstance(venv, AsyncVectorEnv):
        venv.close(terminate=True)
    else:
        venv.close()


def is_timeout(e: BaseException) -> bool:
    """Whether ``e`` is ``AsyncVectorEnv.step_wait``'s timeout."""
    return isinstance(e, multiprocessing.TimeoutError)


def check_batch(name: str, what: str, value: Any, n: int, kind: str) -> np.ndarray:
    """``value`` as an array of shape ``(n,)`` (booleans given as integers 0/1 become bools);
    :class:`EnvError` naming the env unless it is one."""
    arr = np.asarray(value)
    if arr.shape == (n,):
        if kind == "b" and arr.dtype.kind == "b":
            return arr
        if kind == "b" and arr.dtype.kind in "iu" and np.isin(arr, (0, 1)).all():
            return arr.astype(np.bool_)
        if kind == "f" and arr.dtype.kind in "biuf":
            return arr
    todo = ("one real number per sub-env" if kind == "f"
            else "one bool per sub-env")
    raise EnvError(
        f"env {name} returned from step() {what} of shape {arr.shape} and dtype {arr.dtype}; "
        f"a vector env of num_envs={n} must return {todo} (shape ({n},)). Fix the env; the "
        "batch was discarded."
    )
