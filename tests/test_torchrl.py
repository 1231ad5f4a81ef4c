"""daskrl batches in TorchRL: the layout against TorchRL's own collector on the same CartPole
episodes, replay buffers fed from a store, and TorchRL losses trained on batches a real
Collector wrote on a process LocalCluster."""

from __future__ import annotations

import copy
import functools
import math
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn

import daskrl
from daskrl.integrations.torchrl import extend_replay_buffer, to_tensordict, to_torchrl
from daskrl.testing import CountingEnv
from daskrl.worker._envs import EnvSpec
from daskrl.worker._rollout import EnvSet

with warnings.catch_warnings():  # torchrl 0.14 warns about its own classes as it imports them
    warnings.filterwarnings("ignore", r"Creating \w+ which inherits from WeightUpdaterBase",
                            DeprecationWarning)
    from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, ReplayBuffer, SliceSampler
from torchrl.envs import GymWrapper, SerialEnv, StepCounter, TransformedEnv

pytestmark = pytest.mark.timeout(240)


# --- the layout, against TorchRL's collector ---------------------------------------------------

class _Lean(nn.Module):
    """Pushes right when the pole leans left (a poor balancer: episodes end both ways)."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return (obs[..., 2] < -0.15).long()


class _OneHot(nn.Module):
    def forward(self, action: torch.Tensor) -> torch.Tensor:
        return nn.functional.one_hot(action, 2)


class _SeedFirstReset(gym.Wrapper):
    """Resets with ``seed`` until the first step (as daskrl seeds an env's first reset), then
    lets later resets continue the env's generator (as daskrl's do)."""

    def __init__(self, env: gym.Env, seed: int) -> None:
        super().__init__(env)
        self._seed, self._stepped = seed, False

    def reset(self, *, seed=None, options=None):
        return self.env.reset(seed=self._seed if not self._stepped else seed, options=options)

    def step(self, action):
        self._stepped = True
        return self.env.step(action)


@pytest.mark.parametrize("one_hot", [False, True], ids=["categorical", "one_hot"])
def test_layout_matches_torchrl_collector_on_the_same_cartpole_episodes(one_hot):
    E, T, seed = 3, 40, 7
    make = functools.partial(gym.make, "CartPole-v1", max_episode_steps=10)
    envset = EnvSet(EnvSpec(make), n_envs=E, seed=seed, stream=0)
    arrays, _ = envset.collect(_Lean(), torch.device("cpu"), steps=T, batch_id=0)
    assert arrays["terminated"].any() and arrays["truncated"].any()  # both kinds of end
    ours = to_torchrl({k: torch.from_numpy(v) for k, v in arrays.items()}, env_first=True,
                      one_hot_actions=2 if one_hot else None)

    # TorchRL's collector on the same envs, each seeded as daskrl seeds env i of stream 0
    # (docs/reproducibility.md), with TorchRL's step counter
    seeds = [int(s.generate_state(1)[0]) for s in np.random.SeedSequence([seed, 0]).spawn(E)]

    def make_torchrl(s: int) -> GymWrapper:
        return GymWrapper(_SeedFirstReset(make(), s), categorical_action_encoding=not one_hot)

    env = TransformedEnv(SerialEnv(E, [functools.partial(make_torchrl, s) for s in seeds]),
                         StepCounter())
    module = nn.Sequential(_Lean(), _OneHot()) if one_hot else _Lean()
    collector = Collector(env, TensorDictModule(module, in_keys=["observation"],
                                                out_keys=["action"]),
                          frames_per_batch=T * E, total_frames=T * E,
                          auto_register_policy_transforms=False)
    try:
        theirs = next(iter(collector))
    finally:
        collector.shutdown()

    assert ours.batch_size == theirs.batch_size == (E, T)
    assert set(ours.keys(True, True)) == set(theirs.keys(True, True))
    for key in theirs.keys(True, True):
        a, b = ours[key], theirs[key]
        assert (a.shape, a.dtype) == (b.shape, b.dtype), key
        if key != ("collector", "traj_ids"):
            assert torch.equal(a, b), key  # the very same transitions
    # trajectory ids are numbered differently, but split the steps into the same episodes
    ids_ours, ids_theirs = ours["collector", "traj_ids"], theirs["collector", "traj_ids"]
    assert torch.equal(ids_ours[:, 1:] != ids_ours[:, :-1], ids_theirs[:, 1:] != ids_theirs[:, :-1])


# --- replay buffers fed from a store --------------------------------------------------------------

def _counting_store(path, batches: int = 3, T: int = 7, E: int = 3) -> daskrl.TrajectoryStore:
    store = daskrl.TrajectoryStore(str(path), read_only=False)
    store.initialize()
    envset = EnvSet(EnvSpec(lambda: CountingEnv(4)), n_envs=E, seed=0, stream=0)
    for b in range(batches):
        arrays, _ = envset.collect(daskrl.testing.ConstantPolicy(0, torch.int64),
                                   torch.device("cpu"), steps=T, batch_id=b)
        meta = {"frames": T * E, "weights_version": 0, "worker": "w", "device": "cpu",
                "episode_returns": [], "episode_lengths": [], "shape": [T, E]}
        assert store.write_batch(b, arrays, meta)[1]
    store.refresh()
    return daskrl.open_store(str(path))


def test_replay_buffer_from_a_store_holds_every_transition_once_and_slices_episodes(tmp_path):
    store = _counting_store(tmp_path / "s")
    rb = ReplayBuffer(storage=LazyTensorStorage(1000), batch_size=12,
                      sampler=SliceSampler(num_slices=4, traj_key=("collector", "traj_ids")))
    assert extend_replay_buffer(rb, store) == store.frames == len(rb) == 63
    held = rb[:]
    pairs = set(zip(held["collector", "traj_ids"].tolist(), held["step_count"][:, 0].tolist()))
    expected = {(int(i), int(s)) for _h, b in store.iter_batches(["episode_id", "step"])
                for i, s in zip(b["episode_id"].flatten(), b["step"].flatten())}
    assert len(pairs) == 63 and pairs == expected  # every transition, once
    # each env's steps in order: the layout SliceSampler cuts episodes from
    for _ in range(5):
        sample = rb.sample().reshape(4, 3)
        ids, steps = sample["collector", "traj_ids"], sample["step_count"][..., 0]
        assert (ids == ids[:, :1]).all() and (steps[:, 1:] == steps[:, :-1] + 1).all(), sample
        assert torch.equal(sample["next", "observation"],
                           sample["observation"] + torch.tensor([0.0, 1.0]))
    # handles and URLs feed it too
    rb2 = ReplayBuffer(storage=LazyTensorStorage(1000))
    assert extend_replay_buffer(rb2, store.handle(1)) == 21
    assert extend_replay_buffer(rb2, str(tmp_path / "s")) == 63 and len(rb2) == 84


# --- TorchRL losses on what a Collector collected ------------------------------------------------

class _EpsGreedy(nn.Module):
    """Acts greedily on ``q`` (the learner's Q-network) with probability ``1 - eps``."""

    def __init__(self, q: nn.Module, eps: float) -> None:
        super().__init__()
        self.q, self.eps = q, eps

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        greedy = self.q(obs).argmax(-1)
        explore = torch.rand(greedy.shape, device=obs.device) < self.eps
        return torch.where(explore, torch.randint_like(greedy, 2), greedy)


def test_dqn_loss_trains_on_a_replay_buffer_fed_by_a_collector(client, tmp_path):
    from torchrl.data import Categorical, TensorDictReplayBuffer
    from torchrl.modules import QValueActor
    from torchrl.objectives import DQNLoss

    torch.manual_seed(0)
    qnet = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2))
    loss_module = DQNLoss(QValueActor(qnet, in_keys=["observation"], spec=Categorical(2)),
                          action_space="categorical", delay_value=False)
    gamma = 0.9
    loss_module.make_value_estimator(gamma=gamma)
    optimiser = torch.optim.Adam(loss_module.parameters(), lr=1e-2)
    before = copy.deepcopy(qnet.state_dict())
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(1024), batch_size=64)
    explore = _EpsGreedy(qnet, eps=0.3)
    losses = []
    with daskrl.Collector("CartPole-v1", explore, str(tmp_path / "s"), client=client,
                          envs_per_worker=2, frames_per_batch=32, total_frames=192) as collector:
        for handle in collector:
            assert extend_replay_buffer(rb, handle) == handle.frames
            for _ in range(3):
                sample = rb.sample()
                loss = loss_module(sample)["loss"]
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                losses.append(loss.item())
            collector.update_weights(explore)
    assert len(rb) == 192 and len(losses) == 18
    assert all(math.isfinite(v) for v in losses), losses
    after = qnet.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)

    # The buffer holds the store's transitions, and the loss is DQN's own TD error on them:
    # reward + gamma * max Q(next) where not terminated ([..., 1] shapes broadcast right).
    store = daskrl.open_store(str(tmp_path / "s"))
    stored = torch.cat([to_torchrl(h.load(), env_first=True).reshape(-1)["next", "observation"]
                        for h in store])
    assert torch.equal(torch.sort(rb[:]["next", "observation"], 0).values,
                       torch.sort(stored, 0).values)
    sample = rb.sample()
    with torch.no_grad():
        q = qnet(sample["observation"]).gather(-1, sample["action"].unsqueeze(-1))
        target = sample["next", "reward"] + gamma * qnet(sample["next", "observation"]).max(
            -1, keepdim=True).values * (~sample["next", "terminated"])
        expected = ((q - target) ** 2).mean()
        torch.testing.assert_close(loss_module(sample)["loss"], expected)


def test_ppo_loss_trains_on_env_first_batches_with_gae(client, tmp_path):
    from torchrl.modules import ProbabilisticActor, ValueOperator
    from torchrl.objectives import ClipPPOLoss
    from torchrl.objectives.value import GAE

    from daskrl.policies import MLPPolicy

    torch.manual_seed(0)
    env = gym.make("CartPole-v1")
    policy = MLPPolicy(env.observation_space, env.action_space, hidden=(16,))
    actor = ProbabilisticActor(
        TensorDictModule(policy.net, in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"], distribution_class=torch.distributions.Categorical,
        return_log_prob=True)
    critic = ValueOperator(nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1)),
                           in_keys=["observation"])
    advantage = GAE(gamma=0.99, lmbda=0.95, value_network=critic)
    loss_module = ClipPPOLoss(actor, critic)
    loss_module.set_keys(sample_log_prob="log_prob")  # MLPPolicy's extra output, stored as is
    optimiser = torch.optim.Adam(loss_module.parameters(), lr=1e-2)
    before = copy.deepcopy(policy.state_dict())
    losses = []
    with daskrl.Collector("CartPole-v1", policy, str(tmp_path / "s"), client=client,
                          envs_per_worker=2, frames_per_batch=64, total_frames=256) as collector:
        for handle in collector:
            batch = to_tensordict(handle.load())
            td = to_torchrl(batch, env_first=True)  # GAE runs along the last batch dim: time
            assert td.batch_size == (2, 32) and td["log_prob"].shape == (2, 32)
            with torch.no_grad():
                advantage(td)
            assert td["advantage"].shape == (2, 32, 1)
            for _ in range(2):
                out = loss_module(td.reshape(-1))
                loss = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                losses.append(loss.item())
            collector.update_weights(policy)
    assert len(losses) == 8 and all(math.isfinite(v) for v in losses), losses
    after = policy.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


# --- the extra stays optional ------------------------------------------------------------------

def test_importing_daskrl_imports_neither_torchrl_nor_tensordict():
    code = ("import sys, daskrl, daskrl.integrations, daskrl.integrations.torchrl; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torchrl', 'tensordict')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "[]", out
