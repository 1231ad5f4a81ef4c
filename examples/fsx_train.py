"""Train from a daskrl store with no cluster: offline DQN on what fsx_collect.py collected.

The store is opened with ``daskrl.open_store`` (plain zarr reads from the shared filesystem or
object store; no Dask, no workers). A ``torch.utils.data.IterableDataset`` reads it batch by
batch, in a shuffled order each epoch, and shuffles transitions within a window of batches, so
memory stays bounded however large the store is. A Q-network learns from those transitions
(fitted Q-iteration with a target network); its greedy policy is then tried on a local env.

Run::

    python examples/fsx_collect.py --store /fsx/$USER/cartpole-random
    python examples/fsx_train.py --store /fsx/$USER/cartpole-random
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import time
import typing
from collections.abc import Iterator

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, IterableDataset
from tqdm import tqdm

import daskrl
from daskrl.loggers import TensorBoardLogger


@dataclasses.dataclass
class Args:
    store: str = "runs/fsx-demo"
    """store path or fsspec URL written by fsx_collect.py"""
    env_id: str = "CartPole-v1"
    """the env the store was collected on (for the Q-network's size and the evaluation)"""
    epochs: int = 15
    """passes over the store"""
    batch_size: int = 256
    """transitions per gradient step"""
    shuffle_batches: int = 16
    """stored batches mixed together when shuffling transitions"""
    learning_rate: float = 1e-3
    """Adam's learning rate"""
    gamma: float = 0.99
    """discount"""
    target_update_interval: int = 500
    """gradient steps between copies of the Q-network into the target network"""
    hidden: int = 256
    """units of the Q-network's two hidden layers"""
    eval_episodes: int = 10
    """episodes of the greedy policy on a local env after training"""
    seed: int = 0
    """seed of the learner"""
    save: str = ""
    """where to save the trained Q-network's state_dict (default: nowhere)"""
    progress: bool = True
    """show a progress bar"""
    torch_threads: int = 1
    """torch threads: one is fastest for a small MLP on a busy machine"""
    tensorboard: str = ""
    """also log losses/td_loss per epoch (step: gradient steps) to TensorBoard under this directory (pip install "daskrl[tensorboard]")"""


def parse_args() -> Args:
    """Command-line flags from the fields of :class:`Args` (``--epochs 3`` ...)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    hints = typing.get_type_hints(Args)
    for f in dataclasses.fields(Args):
        flag = "--" + f.name.replace("_", "-")
        if hints[f.name] is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        else:
            parser.add_argument(flag, type=hints[f.name], default=f.default)
    return Args(**vars(parser.parse_args()))


class StoreTransitions(IterableDataset):
    """Minibatches of transitions ``(observation, action, reward, next_observation,
    terminated)`` read from a store.

    Each pass reads the store's committed batches in a random order, ``window`` batches at a
    time, shuffles their transitions within the window and yields them ``batch_size`` at a time
    (whole minibatches: indexing tensors beats collating single transitions).
    """

    KEYS = ("observation", "action", "reward", "next_observation", "terminated")

    def __init__(self, url: str, batch_size: int, window: int, seed: int) -> None:
        self.store = daskrl.open_store(url)
        self.batch_ids = self.store.batch_ids()
        if not self.batch_ids:
            raise SystemExit(f"store {url!r} holds no batches: run fsx_collect.py first.")
        self.frames = self.store.frames
        self.batch_size = batch_size
        self.window = window
        self.generator = torch.Generator().manual_seed(seed)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        order = torch.randperm(len(self.batch_ids), generator=self.generator).tolist()
        for start in range(0, len(order), self.window):
            loaded = [self.store.load(self.batch_ids[i], keys=self.KEYS)
                      for i in order[start:start + self.window]]
            flat = {k: torch.cat([b[k].flatten(0, 1) for b in loaded]) for k in self.KEYS}
            perm = torch.randperm(len(flat["reward"]), generator=self.generator)
            for idx in perm.split(self.batch_size):
                yield {k: v[idx] for k, v in flat.items()}


def evaluate(q: nn.Module, env_id: str, episodes: int, seed: int) -> list[float]:
    env = gym.make(env_id)
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        done, total = False, 0.0
        while not done:
            with torch.no_grad():
                action = int(q(torch.as_tensor(obs)[None]).argmax())
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def main(args: Args) -> None:
    torch.set_num_threads(args.torch_threads)
    torch.manual_seed(args.seed)
    data = StoreTransitions(args.store, args.batch_size, args.shuffle_batches, args.seed)
    store = data.store
    first = store.load(data.batch_ids[0], keys=["observation"])["observation"]
    env_id = args.env_id
    env = gym.make(env_id)
    n_actions = int(env.action_space.n)
    env.close()
    q = nn.Sequential(nn.Linear(first.shape[-1], args.hidden), nn.ReLU(),
                      nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                      nn.Linear(args.hidden, n_actions))
    target = copy.deepcopy(q)
    optimizer = torch.optim.Adam(q.parameters(), lr=args.learning_rate)
    loader = DataLoader(data, batch_size=None)  # the dataset yields whole minibatches
    print(f"store {store.url}: {len(data.batch_ids)} batches, {data.frames} frames of {env_id}")
    tb = TensorBoardLogger(args.tensorboard) if args.tensorboard else None
    steps, start = 0, time.perf_counter()
    for epoch in range(args.epochs):
        losses = []
        for batch in tqdm(loader, desc=f"epoch {epoch}", disable=not args.progress, leave=False):
            with torch.no_grad():
                next_q = target(batch["next_observation"].float()).max(-1).values
                y = batch["reward"] + args.gamma * next_q * (~batch["terminated"]).float()
            q_taken = q(batch["observation"].float()).gather(
                1, batch["action"].long()[:, None]).squeeze(1)
            loss = F.smooth_l1_loss(q_taken, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            steps += 1
            if steps % args.target_update_interval == 0:
                target.load_state_dict(q.state_dict())
        print(f"epoch {epoch}: losses/td_loss {np.mean(losses):.4f}  gradient steps {steps}  "
              f"({time.perf_counter() - start:.1f}s)")
        if tb is not None:
            tb.log_metrics({"losses/td_loss": float(np.mean(losses))}, step=steps)
    if tb is not None:
        tb.close()
    returns = evaluate(q, env_id, args.eval_episodes, args.seed + 10_000)
    print(f"greedy policy on {args.eval_episodes} local episodes: mean return "
          f"{np.mean(returns):.1f} (min {min(returns):.0f}, max {max(returns):.0f})")
    if args.save:
        torch.save(q.state_dict(), args.save)
        print(f"saved the Q-network to {args.save}")


if __name__ == "__main__":
    main(parse_args())
