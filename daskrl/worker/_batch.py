"""A batch's arrays as every rollout loop makes them at its start and finishes them at its end,
and the errors that discard a batch."""

from __future__ import annotations

import traceback
from typing import Any

import numpy as np

from daskrl.errors import BatchTimeoutError, EnvError
from daskrl.worker._episodes import Episodes
from daskrl.worker._infos import InfoRecorder
from daskrl.worker._spaces import SpaceLayout

__all__ = ["env_error", "finish_batch", "new_arrays", "non_finite_error", "timeout_error"]


def new_arrays(obs: list[np.ndarray], obs_layout: SpaceLayout, steps: int
               ) -> dict[str, np.ndarray]:
    """A batch's ``[T, E, ...]`` arrays for the envs' current observations ``obs`` (one array
    ``[E, ...]`` per leaf), but for the action and the policy's extras (their shapes come from
    its first output) and the episode columns."""
    E = obs[0].shape[0]
    out: dict[str, np.ndarray] = {}
    for key in ("observation", "next_observation"):
        for name, cur in zip(obs_layout.names(key), obs):
            out[name] = np.empty((steps, *cur.shape), cur.dtype)
    out.update({
        "reward": np.empty((steps, E), np.float32),
        "terminated": np.empty((steps, E), np.bool_),
        "truncated": np.empty((steps, E), np.bool_),
    })
    return out


def finish_batch(out: dict[str, np.ndarray], extras: dict[str, np.ndarray],
                 episodes: Episodes, recorder: InfoRecorder, obs_layout: SpaceLayout,
                 env_name: str, endless_steps: int, batch_id: int, elapsed: float
                 ) -> dict[str, Any]:
    """Check a collected batch (no endless episode, finite observations and rewards), add its
    info entries and the policy's ``extras`` to ``out``; return its stats."""
    episodes.check_endless(env_name, endless_steps)
    if (err := non_finite_error(out, obs_layout, env_name, batch_id)) is not None:
        raise err
    out.update(recorder.arrays())
    out.update(extras)
    return {
        "episode_returns": tuple(episodes.returns),
        "episode_lengths": tuple(episodes.lengths),
        "episode_stats": tuple(recorder.episodes),
        "rollout_seconds": elapsed,
    }


def non_finite_error(out: dict[str, np.ndarray], obs_layout: SpaceLayout, env_name: str,
                     batch_id: int) -> EnvError | None:
    """The error for the first non-finite float observation or reward of a rollout's
    ``[T, E, ...]`` arrays (``None`` when all are finite): it names the env index and step."""
    checks = [(leaf.name("next_observation"), leaf.label("observation"))
              for leaf in obs_layout.leaves] + [("reward", "reward")]
    for key, label in checks:
        arr = out[key]
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            bad = np.argwhere(~np.isfinite(arr.reshape(arr.shape[0], arr.shape[1], -1)))[0]
            return EnvError(
                f"env {env_name} (env index {bad[1]}) returned a non-finite "
                f"{label} at step {bad[0]} of batch {batch_id}. Fix the "
                "env or wrap it to sanitize its output; the batch was discarded."
            )
    return None


def env_error(what: str, e: BaseException) -> EnvError:
    """An :class:`EnvError` that carries the env's own traceback in its message: exception
    chains do not survive pickling from a Dask worker."""
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip()
    return EnvError(f"{what}: {e!r}\n--- the env's traceback, on the worker ---\n{tb}")


def timeout_error(batch_id: int, batch_timeout: float | None, t: int, env_name: str,
                  steps: int | None = None) -> BatchTimeoutError:
    """The error for a batch past its deadline at step ``t`` (of ``steps``, where known)."""
    of = "" if steps is None else f" of {steps}"
    return BatchTimeoutError(
        f"batch {batch_id} ran past its deadline of {batch_timeout:g}s at step {t}{of} (env "
        f"{env_name}); it was stopped and its partial data discarded. Raise batch_timeout or "
        "lower frames_per_batch."
    )
