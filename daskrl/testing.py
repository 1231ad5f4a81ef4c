"""Small, deterministic envs and policies for testing daskrl and code built on it.

They are importable on workers (a package module, not a test file), so they work with
spawn-started Dask workers.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from torch import nn

__all__ = [
    "ConstantPolicy",
    "ContinuityReport",
    "CountingEnv",
    "CountingVectorEnv",
    "EnvVarEnv",
    "EnvVarPolicy",
    "FaultyEnv",
    "GoalCountingEnv",
    "InfoCountingEnv",
    "NoisePolicy",
    "SlowEnv",
    "SpacePolicy",
    "TagPolicy",
    "TupleCountingEnv",
    "check_episode_continuity",
    "recorded_cartpole",
    "worker_weights",
]


class CountingEnv(gym.Env):
    """Observation ``[episode, t]``; reward ``t + 1``; terminates after ``length`` steps.

    Every stored transition must satisfy ``next_observation == observation + [0, 1]``, so a
    junk autoreset transition (``[e, length] -> [e + 1, 0]``) cannot hide.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, length: int = 5, env_var: str | None = None, delay: float = 0.0) -> None:
        self.length = length
        self.delay = delay  # seconds each step sleeps: a slow env, to catch batches in flight
        self.observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.episode = -1
        self.t = 0
        self.env_var_value = None
        if env_var is not None:
            import os

            self.env_var_value = os.environ.get(env_var)

    def _obs(self) -> np.ndarray:
        return np.array([self.episode, self.t], np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any):
        if self.delay:
            import time

            time.sleep(self.delay)
        self.t += 1
        return self._obs(), float(self.t), self.t >= self.length, False, {}


def _first_tensor(obs: Any) -> torch.Tensor:
    """The first tensor of an observation: itself, or the first leaf of a dict or tuple."""
    while not isinstance(obs, torch.Tensor):
        obs = next(iter(obs.values())) if isinstance(obs, dict) else obs[0]
    return obs
class CountingVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` counting sub-envs as one native vector env, in any autoreset mode.

    Sub-env ``i`` counts as a :class:`CountingEnv` of length ``length + i`` (so the sub-envs'
    episodes end at different steps): observation ``[episode, t]``, reward ``t + 1``,
    terminated after ``length + i`` steps, so every stored transition must satisfy
    ``next_observation == observation + [0, 1]``. ``autoreset_mode`` (a
    ``gymnasium.vector.AutoresetMode`` or its value):

    * ``"NextStep"``: the step after an end resets the sub-env (reward 0, no end, the action
      ignored); ``reset()`` resets every sub-env whatever its options, as gymnasium's
      ``CartPoleVectorEnv`` does.
    * ``"SameStep"``: the step that ends an episode returns the next one's first observation,
      the final one in ``info["final_obs"]`` (masked by ``info["_final_obs"]``).
    * ``"Disabled"``: ended sub-envs must be reset with ``reset(options={"reset_mask": m})``
      before the next step (which raises otherwise).

    ``dict_obs=True``: the observation is a ``Dict`` ``{"count": [episode, t], "parity":
    [t % 2]}`` (a ``Box`` and a ``MultiBinary(1)``), batched as gymnasium batches it.
    ``infos=True``: each step's vector ``info`` holds ``t`` (int64, the step count the
    observation shows, masked by ``_t``) and, for the sub-envs that terminate,
    ``is_success``; in ``SameStep`` mode an ended sub-env's entries are in
    ``info["final_info"]`` (the top-level ones are its reset's: ``t == 0``), as gymnasium's
    ``SyncVectorEnv`` has them. Every stored ``info/t`` must equal the ``t`` of its
    ``next_observation``.
    """

    def __init__(self, num_envs: int = 3, length: int = 3,
                 autoreset_mode: Any = "NextStep", dict_obs: bool = False,
                 infos: bool = False) -> None:
        from gymnasium.vector import AutoresetMode
        from gymnasium.vector.utils import batch_space

        self.mode = AutoresetMode(getattr(autoreset_mode, "value", autoreset_mode))
        self.metadata = {"autoreset_mode": self.mode}
        self.num_envs = num_envs
        self.dict_obs, self.infos = dict_obs, infos
        count = spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.single_observation_space = (
            spaces.Dict({"count": count, "parity": spaces.MultiBinary(1)}) if dict_obs
            else count)
        self.single_action_space = spaces.Discrete(2)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.lengths = length + np.arange(num_envs)
        self.episode = np.full(num_envs, -1, np.int64)
        self.t = np.zeros(num_envs, np.int64)
        self.ended = np.zeros(num_envs, np.bool_)

    def _obs(self) -> Any:
        count = np.stack([self.episode, self.t], axis=1).astype(np.float32)
        if not self.dict_obs:
            return count
        return {"count": count, "parity": (self.t % 2).astype(np.int8).reshape(-1, 1)}

    def _row(self, obs: Any, i: int) -> Any:
        return {k: v[i].copy() for k, v in obs.items()} if self.dict_obs else obs[i].copy()

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None):
        from gymnasium.vector import AutoresetMode

        super().reset(seed=seed)
        mask = (options or {}).get("reset_mask")
        if mask is None or self.mode is AutoresetMode.NEXT_STEP:
            mask = np.ones(self.num_envs, np.bool_)
        self.episode[mask] += 1
        self.t[mask] = 0
        self.ended[mask] = False
        return self._obs(), {}

    def step(self, actions: Any):
        from gymnasium.vector import AutoresetMode

        if np.shape(actions) != (self.num_envs,):
            raise ValueError(f"expected {self.num_envs} actions, got shape {np.shape(actions)}")
        if self.mode is AutoresetMode.DISABLED and self.ended.any():
            raise RuntimeError(f"sub-envs {np.flatnonzero(self.ended).tolist()} ended and were "
                               "not reset (autoreset mode Disabled)")
        resetting = self.ended if self.mode is AutoresetMode.NEXT_STEP else np.zeros_like(
            self.ended)
        live = ~resetting
        self.episode[resetting] += 1
        self.t[resetting] = 0
        self.t[live] += 1
        reward = np.where(live, self.t, 0).astype(np.float64)
        terminated = live & (self.t >= self.lengths)
        truncated = np.zeros(self.num_envs, np.bool_)
        obs = self._obs()
        info: dict[str, Any] = {}
        if self.infos:
            info = {"t": self.t.copy(), "_t": np.ones(self.num_envs, np.bool_)}
            if terminated.any():
                info.update(is_success=terminated.copy(), _is_success=terminated.copy())
        if self.mode is AutoresetMode.SAME_STEP:
            if terminated.any():
                final = np.full(self.num_envs, None, dtype=object)
                for i in np.flatnonzero(terminated).tolist():
                    final[i] = self._row(obs, i)
                if self.infos:  # the ended sub-envs' entries: their reset's at the top
                    info["final_info"] = {k: v.copy() for k, v in info.items()}
                    info["_final_info"] = terminated.copy()
                    info.pop("is_success")
                    info.pop("_is_success")
                    info["t"][terminated] = 0
                info.update(final_obs=final, _final_obs=terminated.copy())
                self.episode[terminated] += 1
                self.t[terminated] = 0
                obs = self._obs()
        else:
            self.ended = terminated.copy()
        return obs, reward, terminated, truncated, info


class TagPolicy(nn.Module):
    """Always action 0; reports its ``tag`` parameter as the extra output ``"tag"``.

    Set ``tag`` to the weights version before each ``update_weights`` to check which weights
    computed each stored step.
    """

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.tag = nn.Parameter(torch.zeros((), dtype=dtype))

    def forward(self, obs: Any) -> dict[str, torch.Tensor]:
        first = _first_tensor(obs)  # obs may be a dict or tuple of tensors (a Dict space)
        n = first.shape[0]
        return {
            "action": torch.zeros(n, dtype=torch.int64, device=first.device),
            "tag": self.tag.detach().float().expand(n).clone(),
        }


class ConstantPolicy(nn.Module):
    """Returns a fixed action for every env (for Box or Discrete spaces)."""

    action: torch.Tensor

    def __init__(self, action: Any, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.register_buffer("action", torch.as_tensor(action, dtype=dtype))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.action.expand(obs.shape[0], *self.action.shape).clone()


class EnvVarEnv(CountingEnv):
    """A :class:`CountingEnv` whose first observation entry starts at ``float($name)``.

    Shows that ``env_vars`` reached the worker before the env was built.
    """

    def __init__(self, name: str = "DASKRL_TEST_OFFSET", length: int = 5) -> None:
        import os

        super().__init__(length)
        self.offset = float(os.environ.get(name, "-1"))

    def _obs(self) -> np.ndarray:
        return np.array([self.offset + self.episode, self.t], np.float32)


gym.register("Counting-v0", entry_point="daskrl.testing:CountingEnv", max_episode_steps=None)


class GoalCountingEnv(gym.Env):
    """A goal-conditioned :class:`CountingEnv` with a ``Dict`` observation space, as gymnasium's
    robotics envs have it: ``{"observation": [episode, t], "achieved_goal": [t],
    "desired_goal": [length], "phase": t}`` (``phase`` a ``Discrete``); reward ``t + 1``;
    terminates when the achieved goal reaches the desired one (after ``length`` steps).

    ``dict_actions=True``: the action space is ``Dict({"step": Discrete(2), "force": Box(-1, 1,
    (2,))})`` and the observation also holds ``"last_force"``, the force the env received
    (clipped to the bounds), so a stored ``action`` can be checked against the
    ``next_observation`` it led to.  Every stored transition satisfies ``next["observation"]
    == observation["observation"] + [0, 1]``.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, length: int = 5, dict_actions: bool = False) -> None:
        self.length = length
        self.dict_actions = dict_actions
        entries: dict[str, gym.Space] = {
            "observation": spaces.Box(-np.inf, np.inf, (2,), np.float32),
            "achieved_goal": spaces.Box(-np.inf, np.inf, (1,), np.float32),
            "desired_goal": spaces.Box(-np.inf, np.inf, (1,), np.float32),
            "phase": spaces.Discrete(length + 1),
        }
        if dict_actions:
            entries["last_force"] = spaces.Box(-1.0, 1.0, (2,), np.float32)
            self.action_space = spaces.Dict({"step": spaces.Discrete(2),
                                             "force": spaces.Box(-1.0, 1.0, (2,), np.float32)})
        else:
            self.action_space = spaces.Discrete(2)
        self.observation_space = spaces.Dict(entries)
        self.episode = -1
        self.t = 0
        self.force = np.zeros(2, np.float32)

    def _obs(self) -> dict[str, Any]:
        obs: dict[str, Any] = {
            "observation": np.array([self.episode, self.t], np.float32),
            "achieved_goal": np.array([self.t], np.float32),
            "desired_goal": np.array([self.length], np.float32),
            "phase": self.t,
        }
        if self.dict_actions:
            obs["last_force"] = self.force.copy()
        return obs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        self.force = np.zeros(2, np.float32)
        return self._obs(), {}

    def step(self, action: Any):
        if self.dict_actions:
            if not self.action_space.contains(action):
                raise ValueError(f"action {action!r} is not in {self.action_space!r}")
            self.force = np.asarray(action["force"], np.float32)
        self.t += 1
        return self._obs(), float(self.t), self.t >= self.length, False, {}


class TupleCountingEnv(gym.Env):
    """A :class:`CountingEnv` with a ``Tuple`` observation space: ``([episode, t], t,
    bits)`` (a ``Box``, a ``Discrete`` and the ``MultiBinary(3)`` low bits of ``t``), and a
    ``Tuple`` action space ``(Discrete(2), Box(-1, 1, (1,)))``; reward ``t + 1``; terminates
    after ``length`` steps."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, length: int = 5) -> None:
        self.length = length
        self.observation_space = spaces.Tuple((
            spaces.Box(-np.inf, np.inf, (2,), np.float32), spaces.Discrete(length + 1),
            spaces.MultiBinary(3)))
        self.action_space = spaces.Tuple((spaces.Discrete(2),
                                          spaces.Box(-1.0, 1.0, (1,), np.float32)))
        self.episode = -1
        self.t = 0

    def _obs(self) -> tuple[Any, ...]:
        bits = np.array([(self.t >> b) & 1 for b in range(3)], np.int8)
        return np.array([self.episode, self.t], np.float32), self.t, bits

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any):
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} is not in {self.action_space!r}")
        self.t += 1
        return self._obs(), float(self.t), self.t >= self.length, False, {}


class InfoCountingEnv(CountingEnv):
    """A :class:`CountingEnv` that reports in its ``info``: ``lives`` (``length - t``) at
    every step, ``pos`` (``[episode, t]``, float32) at every step, and ``is_success`` (True)
    at the step it terminates only.

    ``fault="ragged"`` (``pos`` gets a third entry) or ``"string"`` (``lives`` is a string)
    from step ``at`` of an episode on, counted per env.
    """

    instances: ClassVar[int] = 0
    """Envs of this class built in this process (to count rebuilds on a worker)."""

    def __init__(self, length: int = 5, fault: str | None = None, at: int = 3) -> None:
        super().__init__(length)
        self.fault, self.at = fault, at
        InfoCountingEnv.instances += 1

    def step(self, action: Any):
        obs, r, term, trunc, _ = super().step(action)
        info: dict[str, Any] = {"lives": self.length - self.t,
                                "pos": np.array([self.episode, self.t], np.float32)}
        if term:
            info["is_success"] = True
        if self.fault is not None and self.t >= self.at:
            if self.fault == "ragged":
                info["pos"] = np.array([self.episode, self.t, 0], np.float32)
            elif self.fault == "string":
                info["lives"] = "many"
        return obs, r, term, trunc, info


gym.register("GoalCounting-v0", entry_point="daskrl.testing:GoalCountingEnv", max_episode_steps=None)
gym.register("TupleCounting-v0", entry_point="daskrl.testing:TupleCountingEnv",
             max_episode_steps=None)
gym.register("InfoCounting-v0", entry_point="daskrl.testing:InfoCountingEnv",
             max_episode_steps=None)
"""``daskrl collect --env daskrl.testing:GoalCounting-v0`` (a Dict observation space),
``daskrl.testing:TupleCounting-v0``, ``daskrl.testing:InfoCounting-v0 --info-keys lives``."""


def recorded_cartpole() -> gym.Env:
    """``CartPole-v1`` wrapped in ``gymnasium.wrappers.RecordEpisodeStatistics`` (an importable
    factory, for workers)."""
    return gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1"))


def worker_weights(client: Any, collector: Any) -> dict[str, dict[str, bytes]]:
    """The raw bytes of every parameter/buffer each worker's policy holds now, by worker.

    For checking, bit for bit, what workers loaded against what the learner sent.
    """
    name = collector.plugin_name

    def read(dask_worker: Any) -> dict[str, bytes]:
        policy = dask_worker.plugins[name].policy
        tensors = dict(policy.named_parameters()) | dict(policy.named_buffers())
        return {k: _raw_bytes(t) for k, t in tensors.items()}

    return client.run(read)


def _raw_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes()


class SlowEnv(CountingEnv):
    """A :class:`CountingEnv` whose ``step`` sleeps ``delay`` seconds (for fault tests)."""

    def __init__(self, delay: float = 0.002, length: int = 7) -> None:
        super().__init__(length)
        self.delay = delay

    def step(self, action: Any):
        import time

        time.sleep(self.delay)
        return super().step(action)


class FaultyEnv(CountingEnv):
    """A :class:`CountingEnv` that misbehaves at its ``at``-th step (counted per process).

    ``fault`` is one of ``"raise"``, ``"reset"`` (raise in the next reset), ``"nan"``,
    ``"shape"``, ``"dtype"``, ``"hang"`` (sleep ``hang`` seconds), or a wrong step output:
    ``"reward-none"``, ``"reward-vector"``, ``"terminated-array"``, ``"terminated-str"`` (the
    string ``"no"``). With ``once=True`` only the
    first env of the process to reach the step misbehaves, so a restarted env works. Envs
    sharing a ``token`` share the step count; give each test its own.
    """

    _steps: dict[str, int] = {}
    _fired: set[str] = set()

    def __init__(self, fault: str = "raise", at: int = 10, once: bool = False,
                 hang: float = 5.0, length: int = 5, token: str = "") -> None:
        super().__init__(length)
        self.fault, self.at, self.once, self.hang, self.token = fault, at, once, hang, token
        self._reset_armed = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if self._reset_armed:
            raise RuntimeError("injected reset failure")
        return super().reset(seed=seed, options=options)

    def step(self, action: Any):
        steps = FaultyEnv._steps[self.token] = FaultyEnv._steps.get(self.token, 0) + 1
        obs, r, term, trunc, info = super().step(action)
        if steps >= self.at and not (self.once and self.token in FaultyEnv._fired):
            FaultyEnv._fired.add(self.token)
            if self.fault == "raise":
                raise RuntimeError("injected step failure")
            if self.fault == "reset":
                self._reset_armed = True
                return obs, r, True, trunc, info
            if self.fault == "nan":
                obs = obs.copy()
                obs[0] = np.nan
            elif self.fault == "shape":
                obs = np.zeros(3, np.float32)
            elif self.fault == "dtype":
                obs = np.array(["a", "b"])
            elif self.fault == "hang":
                import time

                time.sleep(self.hang)
            elif self.fault == "reward-none":
                r = None
            elif self.fault == "reward-vector":
                r = np.array([r, r])
            elif self.fault == "terminated-array":
                term = np.array([term])
            elif self.fault == "terminated-str":
                term = "no"
        return obs, r, term, trunc, info


gym.register("Faulty-v0", entry_point="daskrl.testing:FaultyEnv", max_episode_steps=None)
"""``daskrl collect --env daskrl.testing:Faulty-v0 --env-kwargs '{"at": 40}'``: a misbehaving env
by id, for the command line."""


class EnvVarPolicy(TagPolicy):
    """A :class:`TagPolicy` that reads the environment variable ``name`` at every step: it
    raises ``KeyError`` where that is unset (say, set on the learner but not on workers)."""

    def __init__(self, name: str = "DASKRL_TEST_POLICY_VAR") -> None:
        super().__init__()
        self.name = name

    def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        import os

        os.environ[self.name]  # the lookup is the point
        return super().forward(obs)


class SpacePolicy(nn.Module):
    """Random actions of any supported action space, nested for a ``Dict`` or ``Tuple`` one:
    integers in range for ``Discrete``/``MultiDiscrete``/``MultiBinary`` entries, and for a
    ``Box`` normal samples of scale ``box_scale`` (so that some fall outside bounds of +-1,
    which the env receives clipped).  Works on any observation, nested or not."""

    def __init__(self, action_space: gym.Space, box_scale: float = 2.0) -> None:
        super().__init__()
        self.action_space = action_space
        self.box_scale = box_scale

    def forward(self, obs: Any) -> dict[str, Any]:
        first = _first_tensor(obs)
        return {"action": self._sample(self.action_space, first.shape[0], first.device)}

    def _sample(self, space: gym.Space, n: int, device: torch.device) -> Any:
        if isinstance(space, spaces.Dict):
            return {k: self._sample(s, n, device) for k, s in space.spaces.items()}
        if isinstance(space, spaces.Tuple):
            return tuple(self._sample(s, n, device) for s in space.spaces)
        if isinstance(space, spaces.Discrete):
            return torch.randint(int(space.n), (n,), device=device) + int(space.start)
        if isinstance(space, spaces.MultiDiscrete):
            nvec = torch.as_tensor(space.nvec, device=device)
            return (torch.rand(n, *space.shape, device=device) * nvec).long() + torch.as_tensor(
                space.start, device=device)
        if isinstance(space, spaces.MultiBinary):
            return torch.randint(2, (n, *space.shape), device=device, dtype=torch.int8)
        return torch.randn(n, *space.shape, device=device) * self.box_scale  # type: ignore[misc]


class NoisePolicy(nn.Module):
    """Action 0, plus an extra output ``"noise"`` of ``width`` incompressible floats per env."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.width = width

    def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        n = obs.shape[0]
        return {"action": torch.zeros(n, dtype=torch.int64), "noise": torch.rand(n, self.width)}


# -- episode continuity ---------------------------------------------------------------------------
_CONTINUITY_KEYS = ("episode_id", "step", "terminated", "truncated", "observation",
                    "next_observation")


@dataclasses.dataclass(frozen=True)
class ContinuityReport:
    """What :func:`check_episode_continuity` checked."""

    batches: int
    transitions: int
    episodes: int
    """Distinct episode ids."""
    ended: int
    """Episodes that ended with ``terminated`` or ``truncated``."""
    cut: int
    """Episodes that stop at a batch's last step without a flag (cut, or still running)."""


@dataclasses.dataclass
class _Open:
    batch_id: int
    env: int
    step: int
    next_obs: np.ndarray


def _rows(batch: dict[str, np.ndarray], key: str) -> np.ndarray:
    """Array ``key`` of a batch; for a Dict or Tuple space (``key/...`` arrays), the bytes of
    all its arrays per row ``[T, E, n]``, which compare equal exactly when every entry does."""
    if key in batch:
        return batch[key]
    leaves = [a for n, a in sorted(batch.items()) if n.startswith(key + "/")]
    T, E = leaves[0].shape[:2]
    return np.concatenate([np.ascontiguousarray(a).reshape(T, E, -1).view(np.uint8)
                           for a in leaves], axis=2)


def check_episode_continuity(store: Any, max_problems: int = 20) -> ContinuityReport:
    """Check every episode of ``store`` is continuous; raise ``AssertionError`` listing the
    first ``max_problems`` breaks.

    The rules (``docs/store-format.md``, *Transitions and episodes*), for a store from which
    nothing was deleted: an episode's rows are one env column; its ``step`` runs 0, 1, 2, ...;
    its first row is at ``t = s`` in the batch its id names (``episode_id =
    episode_id_base(batch_id) + s * E + e``), or at ``t = 0`` of that batch's stream successor when ``s == T``; only its
    last row may be ``terminated`` or ``truncated``; within a batch ``observation[t + 1] ==
    next_observation[t]``; it continues into a later batch only from that batch's last step,
    at ``t = 0`` of the stream's next committed batch (when records name their stream), with
    ``observation`` equal to the last ``next_observation``. An episode that stops at a batch's
    last step without a flag is cut (or still running), which the format allows.
    """
    from daskrl.store._layout import episode_origin, run_of

    records = store.records()
    ids = sorted(records)
    # The committed batch before each batch in its stream (when records name their stream).
    stream_prev: dict[int, int | None] = {}
    last_of_stream: dict[int, int] = {}
    for bid in ids:
        stream = records[bid].get("stream")
        if isinstance(stream, int):
            key = run_of(bid) * 1_000_000 + stream  # streams are per run
            stream_prev[bid] = last_of_stream.get(key)
            last_of_stream[key] = bid
    problems: list[str] = []
    shapes: dict[int, tuple[int, int]] = {}
    ended_last: dict[int, np.ndarray] = {}  # env columns whose episode ended at the last step
    open_eps: dict[int, _Open] = {}
    seen: set[int] = set()
    transitions = ended = 0

    def bad(msg: str) -> None:
        problems.append(msg)

    for bid in ids:
        b = {k: v.numpy() for k, v in store.load(bid, keys=list(_CONTINUITY_KEYS), flat=True).items()}
        eid, step = b["episode_id"], b["step"]
        obs, nxt = _rows(b, "observation"), _rows(b, "next_observation")
        done = b["terminated"] | b["truncated"]
        T, E = eid.shape[:2]
        shapes[bid] = (T, E)
        ended_last[bid] = done[T - 1].copy()
        transitions += T * E
        for e in range(E):
            col = eid[:, e]
            starts = np.flatnonzero(np.r_[True, col[1:] != col[:-1]])
            for a, z in zip(starts.tolist(), [*starts[1:].tolist(), T]):
                i = int(col[a])
                where = f"episode {i} (batch {bid}, env {e}, t={a})"
                st = step[a:z, e]
                if not np.array_equal(st, np.arange(st[0], st[0] + (z - a))):
                    bad(f"{where}: steps {st.tolist()} are not consecutive")
                if z - a > 1 and not np.array_equal(obs[a + 1:z, e], nxt[a:z - 1, e]):
                    bad(f"{where}: observation[t + 1] != next_observation[t] inside the batch")
                if done[a:z - 1, e].any():
                    bad(f"{where}: rows follow a terminated/truncated step under the same id")
                if a > 0 and not done[a - 1, e]:
                    bad(f"{where}: a new episode starts at t={a} although the one before "
                        "it did not end")
                if int(st[0]) == 0:
                    if i in seen:
                        bad(f"{where}: episode id used twice")
                    origin, rest = episode_origin(i)
                    s, env = divmod(rest, E)
                    if env != e:
                        bad(f"{where}: its id names env {env}")
                    elif origin == bid:
                        if s != a:
                            bad(f"{where}: its id names t={s}")
                    elif origin not in shapes:
                        bad(f"{where}: its id names batch {origin}, which is not in the store "
                            "before it")
                    elif a != 0 or s != shapes[origin][0] or not ended_last[origin][e]:
                        bad(f"{where}: its id names batch {origin} t={s}, but the env did not "
                            f"end an episode at the last step of batch {origin} there")
                    elif bid in stream_prev and stream_prev[bid] != origin:
                        bad(f"{where}: its id names batch {origin}, which is not the batch "
                            f"before {bid} in its stream ({stream_prev[bid]})")
                else:
                    prev = open_eps.pop(i, None)
                    if prev is None:
                        bad(f"{where}: starts at step {int(st[0])}; its first steps are in no "
                            "batch")
                    elif a != 0 or prev.env != e or prev.step + 1 != int(st[0]):
                        bad(f"{where}: continues episode {i} (last seen at step {prev.step}, "
                            f"env {prev.env}, batch {prev.batch_id}) out of order")
                    elif bid in stream_prev and stream_prev[bid] != prev.batch_id:
                        bad(f"{where}: continues from batch {prev.batch_id}, which is not the "
                            f"batch before {bid} in its stream ({stream_prev[bid]})")
                    elif not np.array_equal(obs[0, e], prev.next_obs):
                        bad(f"{where}: its observation is not the next_observation its "
                            f"previous step in batch {prev.batch_id} ended with")
                seen.add(i)
                if done[z - 1, e]:
                    ended += 1
                elif z == T:
                    open_eps[i] = _Open(bid, e, int(st[-1]), nxt[T - 1, e].copy())
                else:
                    bad(f"{where}: stops at t={z - 1} without an end, inside the batch")
    if problems:
        more = f" (and {len(problems) - max_problems} more)" if len(problems) > max_problems else ""
        raise AssertionError(f"store {store.url!r}: episodes are not continuous{more}:\n  "
                             + "\n  ".join(problems[:max_problems]))
    return ContinuityReport(len(ids), transitions, len(seen), ended, len(open_eps))
