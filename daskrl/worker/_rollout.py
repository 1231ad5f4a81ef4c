"""Rollouts: a stream's ``E`` envs stepped together by a torch policy for ``T`` steps.

An :class:`EnvSet` lives on its worker between tasks, so episodes continue across batches. Its
envs are single gymnasium envs (:class:`~daskrl.worker._single_envs.SingleEnvs`, which reset one
env at a time) or one vector env (:class:`~daskrl.worker._vector.VectorEnvs`); both are stepped
by one loop, in which row ``t`` of the batch is step ``t`` of every env. A vector env that can
neither reset a sub-env alone nor return its final observation is stepped by
:class:`~daskrl.worker._vector_staggered.StaggeredLoop` instead. Both loops keep their episodes
in :class:`~daskrl.worker._episodes.Episodes` and end a batch with
:func:`~daskrl.worker._batch.finish_batch`.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from daskrl.errors import PolicyError
from daskrl.store._layout import EPISODE_ID_STRIDE
from daskrl.worker._batch import finish_batch, new_arrays, timeout_error
from daskrl.worker._envs import EnvSpec
from daskrl.worker._episodes import Episodes
from daskrl.worker._infos import InfoRecorder, InfoSpecs
from daskrl.worker._policy_output import OutputReader, policy_error
from daskrl.worker._recurrent import IS_INIT_KEY, PolicyState, is_recurrent
from daskrl.worker._single_envs import SingleEnvs
from daskrl.worker._vector import VectorEnvs
from daskrl.worker._vector_staggered import StaggeredLoop

__all__ = ["EPISODE_ID_STRIDE", "EnvSet"]


class EnvSet:
    """``E`` environments of one collection stream (single envs, or one vector env of ``E``
    sub-envs), with their episode bookkeeping."""

    def __init__(self, spec: EnvSpec, n_envs: int, seed: int, stream: int,
                 restart: tuple[int, ...] = (), info_keys: tuple[str, ...] = (),
                 store_policy_state: str = "first") -> None:
        self.spec = spec
        self.n_envs = n_envs
        self.info_keys = info_keys
        self.store_policy_state = store_policy_state
        self.info_specs: InfoSpecs = {}
        """Shapes and dtypes of the info entries, as first reported (kept across batches)."""
        # A stream's envs seed from (seed, stream); envs rebuilt mid-stream (``restart``: the
        # batch id they were rebuilt for) get a stream of their own, so no episode repeats.
        key = [seed, stream, *restart]
        seeds = [int(s.generate_state(1)[0]) for s in np.random.SeedSequence(key).spawn(n_envs)]
        self.envs: SingleEnvs | VectorEnvs
        if spec.is_vector:
            # one seed for a vector env that takes one; 31 bits, as envpool's must be
            vector_seed = int(np.random.SeedSequence(key).generate_state(1)[0]) & 0x7FFF_FFFF
            self.envs = VectorEnvs(spec, n_envs, seeds, vector_seed)
        else:
            self.envs = SingleEnvs(spec, n_envs, seeds)
        self.episodes = Episodes(n_envs)
        self._staggered = (StaggeredLoop(self.envs, self.episodes)
                           if isinstance(self.envs, VectorEnvs) and self.envs.staggered else None)
        self._needs_reset = True
        self.policy_state: PolicyState | None = None
        """A recurrent policy's state (None for a stateless policy: decided at the first
        batch, once for the env set)."""
        self._recurrent: bool | None = None
        self.last_batch_id: int | None = None
        """The batch this env set collected last (its envs continue from there)."""

    @property
    def obs_space(self) -> gym.Space:
        """The observation space of one env."""
        return self.envs.obs_space

    @property
    def act_space(self) -> gym.Space:
        """The action space of one env."""
        return self.envs.act_space

    @property
    def staggered(self) -> bool:
        """Whether the env's own reset steps are skipped, and columns fill at their own pace."""
        return self._staggered is not None

    def close(self) -> None:
        """Close the envs."""
        self.envs.close()

    def collect(
        self,
        policy: torch.nn.Module,
        device: torch.device,
        steps: int,
        batch_id: int,
        random_steps: int = 0,
        reset: bool = False,
        batch_timeout: float | None = None,
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Step every env ``steps`` times (a staggered vector env: until each sub-env has made
        ``steps`` real transitions); return ``(arrays [T, E, ...], stats)``.

        After an error the envs start new episodes at the next batch."""
        if self._recurrent is None:
            self._recurrent = is_recurrent(policy)
            if self._recurrent:
                self.policy_state = PolicyState(self.n_envs,
                                                self.store_policy_state == "every_step")
        rec = self.policy_state
        try:
            if reset or self._needs_reset:
                self.envs.reset_all(batch_id)
                self.episodes.restart(batch_id)
                if self._staggered is not None:
                    self._staggered.restart()
                if rec is not None:
                    rec.clear()
                self._needs_reset = False
            if rec is not None:
                rec.begin(policy, device, steps, record=self._staggered is None)
            if isinstance(self.envs, VectorEnvs):
                self.envs.batch_timeout = batch_timeout
            deadline = None if batch_timeout is None else time.monotonic() + batch_timeout
            recorder = InfoRecorder(self.info_keys, steps, self.n_envs, env_name=self.spec.name,
                                    batch_id=batch_id, specs=self.info_specs)
            t0 = time.perf_counter()
            extras: dict[str, np.ndarray] = {}
            act = policy if rec is None else rec.bind(policy)
            if self._staggered is not None:
                out = self._staggered.run(act, device, steps, batch_id, random_steps,
                                          deadline, recorder, rec)
            else:
                out = self._aligned(act, device, steps, batch_id, random_steps, deadline,
                                    batch_timeout, recorder, extras, rec)
            if rec is not None:
                if self._staggered is None:
                    out.update(rec.arrays())
                out[IS_INIT_KEY] = out["step"] == 0
            elapsed = time.perf_counter() - t0
            stats = finish_batch(out, extras, self.episodes, recorder, self.envs.obs_layout,
                                 self.spec.name, self.spec.endless_episode_steps, batch_id,
                                 elapsed)
        except BaseException:
            self._needs_reset = True
            raise
        self.last_batch_id = batch_id
        return out, stats

    def _aligned(self, policy: Any, device: torch.device, steps: int,
                 batch_id: int, random_steps: int, deadline: float | None,
                 batch_timeout: float | None, recorder: InfoRecorder,
                 extras: dict[str, np.ndarray], rec: PolicyState | None
                 ) -> dict[str, np.ndarray]:
        """Every step a real one for every env: row ``t`` of the batch is step ``t``. The
        loop does per step only what the step needs (the envs' outputs, checked; the
        policy's; the resets); ``episode_id`` and ``step`` are derived at the end from where
        episodes started, and on CPU the policy reads tensors made once over the envs'
        current observations. The policy's extra outputs go to ``extras``. ``policy``: a
        stateless one (a recurrent policy bound to its state ``rec``, whose rows are reset
        where episodes end)."""
        envs, episodes, E = self.envs, self.episodes, self.n_envs
        obs, obs_layout, act_layout = envs.obs, envs.obs_layout, envs.act_layout
        out = new_arrays(obs, obs_layout, steps)
        rewards_out, term_out, trunc_out = out["reward"], out["terminated"], out["truncated"]
        obs_bufs = [out[n] for n in obs_layout.names("observation")]
        next_bufs = [out[n] for n in obs_layout.names("next_observation")]
        act_bufs: list[np.ndarray] = []
        keep_infos = bool(self.info_keys)
        record, record_ends = envs.info_recorders(recorder)
        step = envs.step
        episodes.begin(batch_id)
        episode_return = episodes.ret
        # On CPU the policy reads the observations in place, through tensors made once (they
        # are not changed until the policy has returned); elsewhere they are copied over.
        on_cpu = device.type == "cpu"
        obs_in = [torch.from_numpy(cur) for cur in obs] if on_cpu else []
        no_grad = torch.inference_mode()
        for t in range(steps):
            for buf, cur in zip(obs_bufs, obs):
                buf[t] = cur
            obs_t = obs_layout.join(obs_in if on_cpu else [
                torch.as_tensor(cur, device=device) for cur in obs])
            try:
                with no_grad:
                    policy_out = policy(obs_t)
            except PolicyError:
                raise
            except Exception as e:
                raise policy_error(e, self.spec.name, t, batch_id, obs_t) from e
            if t == 0:
                read = OutputReader(policy_out, envs.act_space, E, self.spec.name)
            actions, extra_np = read(policy_out)
            if t == 0:
                for name, a in zip(act_layout.names("action"), actions):
                    out[name] = np.empty((steps, *a.shape), a.dtype)
                    act_bufs.append(out[name])
                for k, v in extra_np.items():
                    extras[k] = np.empty((steps, *v.shape), v.dtype)
            for k, v in extra_np.items():
                extras[k][t] = v
            if t < random_steps:
                actions = act_layout.sample(actions, list(range(E)), envs.action_spaces)
            for buf, a in zip(act_bufs, actions):
                buf[t] = a
            reward_a, term_a, trunc_a, info, ended = step(actions, t, batch_id, deadline,
                                                          next_bufs)
            rewards_out[t] = reward_a
            term_out[t] = term_a
            trunc_out[t] = trunc_a
            episode_return += reward_a  # float64 sums of the env's own rewards
            if keep_infos:
                record(t, info, done=term_a | trunc_a)
            if ended:
                done = (term_a | trunc_a).nonzero()[0].tolist()
                if not keep_infos:
                    record_ends(done, info, t)
                episodes.end(t, done)
                if rec is not None:
                    rec.reset(done)
                envs.reset_ended(done, t, batch_id)
            if deadline is not None and time.monotonic() > deadline:
                raise timeout_error(batch_id, batch_timeout, t, self.spec.name, steps)
        out["episode_id"], out["step"] = episodes.finish(steps)
        return out
