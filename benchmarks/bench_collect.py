"""Collection throughput of daskrl against a no-framework ceiling, on the same workload.

For each env (CartPole-v1, Pendulum-v1 by default) and each worker count N (1 and 2), with
8 envs per worker, ``MLPPolicy(hidden=(64, 64))`` and ``--batches-per-worker`` batches of
4096 frames per worker:

* ceiling: N spawned processes, each with a plain list of 8 envs stepped in a loop (same-step
  autoreset, as daskrl does) and the policy under ``torch.inference_mode()``, copying every
  step into preallocated numpy arrays. One torch/OMP thread each, like a Dask nanny worker.
  The policy has the same weights as daskrl's (:data:`POLICY_SEED`), and the tables give both
  sides' episodes per 1,000 frames: the same workload, resets included.
  Envs and policy are built before a barrier; frames/s = all frames / slowest process's time.
* daskrl: ``daskrl.Collector`` on the embedded cluster's set-up
  (``daskrl.deploy.local_cluster(N)``: N one-thread workers, TLS) started beforehand, in sync
  and async mode, and in sync mode again on the same cluster without TLS (its cost); one
  warm-up run per workload (2 batches per worker), then the timed runs: from just before
  iterating to the last handle (batches are written to a temporary zarr store, never
  loaded). The cluster is reused for every workload at a given N.

A recurrent policy (``--policies gru``: ``daskrl.testing.GRUPolicy`` with a hidden state of
:data:`GRU_HIDDEN`, on envs with ``Discrete`` actions) runs on both sides with its state: the
ceiling carries it from step to step, resets the rows of the envs whose episode starts to the
initial state, and copies it once per batch (the ``policy_state`` a batch stores), as daskrl's
workers do; both store the GRU's ``logits`` as its extra output.

Each of ``--repeats`` repeats times, for each workload, the ceiling and then daskrl, one after
the other (the cluster idles, started, while the ceiling runs), so that each ratio compares
runs seconds apart: a shared machine's speed drifts by 10-20 % within minutes. The tables give
the median ratio over the repeats and its range.

"steady" is the ratio of a long run's rates: each daskrl worker's handles after its first, over
the time from its first handle to its last, against each ceiling process's batches after its
first (summed over workers and processes). It leaves out what a run pays once: the pipeline's
fill (the first batch's task, weights and hand-over) on daskrl's side, the first batch's
warm-up on the ceiling's. ``bench_startup.py`` measures the start.

"quickest" is a third ratio, for a machine whose speed swings faster than a run lasts: each
worker's quickest batches, as the learner got them (every cost of a batch included: its task,
rollout, write and hand-over), against each ceiling process's quickest batch-sized stretch of
steps, over all repeats (:func:`quickest_batch`). It compares the two where the machine slowed
neither, as ``timeit`` takes the quickest run.

Vector envs (``--vector-envs``, default ``CartPole-v1`` and ``envpool:Pong-v5``; ``--vector-envs
none`` skips them): the same env as one vector env of 8 sub-envs, ``gymnasium.make_vec(..., vectorization_mode=
"vector_entry_point")`` (``envpool:ID`` for ``envpool.make_gymnasium(ID)``, e.g.
``envpool:Pong-v5``), against the same vector env in a plain loop (the ceiling for that env
kind: one ``step`` per step, every step copied, the env's own reset steps kept as cleanrl keeps
them), and daskrl collecting it (``vectorization_mode="vector_entry_point"`` or an envpool
factory), sync mode, side by side with the single-env figures of that env where it is in
``--envs``; with the sampling and GRU policies among ``--policies``.

Run:  python benchmarks/bench_collect.py [--batches-per-worker 16] [--repeats 1] [--json out.json]

On a small or shared machine the numbers are noisy (N=2 on 2 cores also shares the cores with
the scheduler and this process); use ``--repeats 3`` or more.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import multiprocessing as mp
import os
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch
from distributed import Client

from daskrl import Collector
from daskrl.deploy import local_cluster
from daskrl.policies import MLPPolicy
from daskrl.testing import GRUPolicy

DEFAULT_VECTOR_ENVS = ("CartPole-v1", "envpool:Pong-v5")
"""CartPole with its vector entry point, and Atari Pong through envpool (4 stacked 84x84 grey
frames, uint8)."""
ENVS_PER_WORKER = 8
FRAMES_PER_BATCH = 4096
HIDDEN = (64, 64)
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
POLICIES = ("sampling", "greedy", "gru")
DEFAULT_POLICIES = ("sampling", "greedy")
VECTOR_POLICIES = ("sampling", "gru")
"""The policies the vector-env workloads run, of those chosen."""
GRU_HIDDEN = 64
"""The hidden size of the ``gru`` policy (``daskrl.testing.GRUPolicy``), the MLP's width."""
BATCH_STEPS = FRAMES_PER_BATCH // ENVS_PER_WORKER
"""Steps of one batch: the ceiling loops time each such stretch too."""



def _ceiling_buffers(steps: int, obs: np.ndarray, act_space, discrete: bool,
                     policy: torch.nn.Module) -> dict:
    """The ceiling loops' preallocated ``[T, E, ...]`` arrays (what a worker's batch holds),
    with the policy's extra output (``log_prob``, or the GRU's ``logits``) and a recurrent
    policy's state before each batch (``policy_state``, ``[batches, E, ...]``)."""
    E = obs.shape[0]
    buf = {
        "observation": np.empty((steps, *obs.shape), obs.dtype),
        "next_observation": np.empty((steps, *obs.shape), obs.dtype),
        "action": np.empty((steps, E, *act_space.shape), np.int64 if discrete else np.float32),
        "reward": np.empty((steps, E), np.float32),
        "terminated": np.empty((steps, E), np.bool_),
        "truncated": np.empty((steps, E), np.bool_),
    }
    if isinstance(policy, GRUPolicy):
        buf["logits"] = np.empty((steps, E, act_space.n), np.float32)
        buf["policy_state"] = np.empty((-(-steps // BATCH_STEPS), E, policy.hidden), np.float32)
    else:
        buf["log_prob"] = np.empty((steps, E), np.float32)
    return buf


def _extra_key(policy: torch.nn.Module) -> str | None:
    """The extra output a ceiling loop stores: ``log_prob``, ``logits`` (the GRU's) or none."""
    return ("logits" if isinstance(policy, GRUPolicy) else
            None if isinstance(policy, GreedyMLP) else "log_prob")


class GreedyMLP(torch.nn.Module):
    """The greedy version of ``MLPPolicy``'s network: the argmax action (``Discrete``), or the
    mean action (``Box``); no log-probability."""

    def __init__(self, obs_space: gym.Space, act_space: gym.Space) -> None:
        super().__init__()
        mlp = MLPPolicy(obs_space, act_space, hidden=HIDDEN)
        self.net, self.discrete = mlp.net, mlp.discrete
        if not self.discrete:
            self.register_buffer("center", mlp.center)
            self.register_buffer("scale", mlp.scale)

    def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self.net(obs.flatten(1).float())
        if self.discrete:
            return {"action": x.argmax(1)}
        return {"action": self.center + self.scale * torch.tanh(x)}


def supports(kind: str, act_space: gym.Space) -> bool:
    """Whether the policy ``kind`` runs on ``act_space`` (the GRU samples ``Discrete``
    actions only)."""
    return kind != "gru" or isinstance(act_space, gym.spaces.Discrete)


POLICY_SEED = 0
"""Every policy of a workload has the weights this seed gives: the ceiling's processes and
daskrl's learner run the same network. (With other weights a greedy CartPole policy ends its
episodes at another rate, and a reset costs more than a step: measured 5 % apart.)"""


def make_policy(kind: str, obs_space: gym.Space, act_space: gym.Space) -> torch.nn.Module:
    """``MLPPolicy(hidden=HIDDEN)`` (``"sampling"``), its :class:`GreedyMLP`, or a recurrent
    ``GRUPolicy(hidden=GRU_HIDDEN)`` (``"gru"``), with the weights of :data:`POLICY_SEED` (the
    caller's random state is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(POLICY_SEED)
        if kind == "greedy":
            return GreedyMLP(obs_space, act_space)
        if kind == "gru":
            return GRUPolicy(int(np.prod(obs_space.shape)), int(act_space.n), hidden=GRU_HIDDEN)
        return MLPPolicy(obs_space, act_space, hidden=HIDDEN)


def ceiling_loop(env_id: str, steps: int, seed: int, barrier, results,
                 policy_kind: str = "sampling") -> None:
    """One process of the ceiling: build, wait on the barrier, then time ``steps`` steps."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    E = ENVS_PER_WORKER
    envs = [gym.make(env_id) for _ in range(E)]
    obs_space, act_space = envs[0].observation_space, envs[0].action_space
    policy = make_policy(policy_kind, obs_space, act_space)
    discrete = isinstance(act_space, gym.spaces.Discrete)
    obs = np.stack([env.reset(seed=seed * 1000 + i)[0] for i, env in enumerate(envs)])
    buf = _ceiling_buffers(steps, obs, act_space, discrete, policy)
    extra = _extra_key(policy)
    recurrent = isinstance(policy, GRUPolicy)
    with torch.inference_mode():  # a recurrent policy's state, carried from step to step
        init = policy.initial_state(E) if recurrent else None
        state = init.clone() if recurrent else None
    barrier.wait()
    batch_ends: list[float] = []
    episodes = 0
    t0 = time.perf_counter()
    for t in range(steps):
        if t % BATCH_STEPS == 0:
            batch_ends.append(time.perf_counter())
            if recurrent:  # the one copy of the state a batch stores
                buf["policy_state"][t // BATCH_STEPS] = state.numpy()
        buf["observation"][t] = obs
        with torch.inference_mode():
            if recurrent:
                out, state = policy(torch.as_tensor(obs), state)
            else:
                out = policy(torch.as_tensor(obs))
        action = out["action"].numpy()
        buf["action"][t] = action
        if extra is not None:
            buf[extra][t] = out[extra].numpy()
        done = []
        for i, env in enumerate(envs):
            nobs, r, term, trunc, _ = env.step(int(action[i]) if discrete else action[i])
            buf["next_observation"][t, i] = nobs
            buf["reward"][t, i] = r
            buf["terminated"][t, i] = term
            buf["truncated"][t, i] = trunc
            if term or trunc:
                obs[i] = env.reset()[0]
                episodes += 1
                done.append(i)
            else:
                obs[i] = nobs
        if recurrent and done:  # their next episodes start from the initial state
            with torch.inference_mode():
                state[done] = init[done]
    times = [*batch_ends, time.perf_counter()]
    results.put((times[-1] - t0, quickest_batch(times), episodes, steady_batch(times)))


def default_vector_envs() -> list[str]:
    """:data:`DEFAULT_VECTOR_ENVS`, without envpool's where envpool is not installed."""
    try:
        import envpool  # noqa: F401
    except ImportError:
        print("envpool is not installed (pip install 'daskrl[envpool]'): no Pong workload")
        return [e for e in DEFAULT_VECTOR_ENVS if not e.startswith("envpool:")]
    return list(DEFAULT_VECTOR_ENVS)


def make_vector_env(spec: str, seed: int = 0):
    """``spec``'s vector env of ENVS_PER_WORKER sub-envs: ``envpool:ID`` or a gymnasium id with
    a vector entry point."""
    if spec.startswith("envpool:"):
        import envpool

        return envpool.make_gymnasium(spec.partition(":")[2], num_envs=ENVS_PER_WORKER,
                                      seed=seed)
    return gym.make_vec(spec, num_envs=ENVS_PER_WORKER, vectorization_mode="vector_entry_point")


def vector_ceiling_loop(spec: str, steps: int, seed: int, barrier, results,
                        policy_kind: str = "sampling") -> None:
    """One process of the vector-env ceiling: the vector env stepped in a plain loop. A
    recurrent policy's rows restart from the initial state after a sub-env's reset step (the
    step after its episode's end, whose observation is the next episode's first)."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    venv = make_vector_env(spec, seed)
    obs_space, act_space = venv.single_observation_space, venv.single_action_space
    policy = make_policy(policy_kind, obs_space, act_space)
    discrete = isinstance(act_space, gym.spaces.Discrete)
    obs, _ = venv.reset(seed=None if spec.startswith("envpool:") else seed)
    buf = _ceiling_buffers(steps, obs, act_space, discrete, policy)
    extra = _extra_key(policy)
    recurrent = isinstance(policy, GRUPolicy)
    with torch.inference_mode():
        init = policy.initial_state(ENVS_PER_WORKER) if recurrent else None
        state = init.clone() if recurrent else None
    ended = np.zeros(ENVS_PER_WORKER, np.bool_)
    barrier.wait()
    batch_ends: list[float] = []
    t0 = time.perf_counter()
    for t in range(steps):
        if t % BATCH_STEPS == 0:
            batch_ends.append(time.perf_counter())
            if recurrent:
                buf["policy_state"][t // BATCH_STEPS] = state.numpy()
        buf["observation"][t] = obs
        with torch.inference_mode():
            if recurrent:
                out, state = policy(torch.as_tensor(obs), state)
            else:
                out = policy(torch.as_tensor(obs))
        action = out["action"].numpy()
        buf["action"][t] = action
        if extra is not None:
            buf[extra][t] = out[extra].numpy()
        obs, r, term, trunc, _ = venv.step(action)
        if recurrent and ended.any():  # their reset step: the next episodes start
            with torch.inference_mode():
                state[ended] = init[ended]
        ended = term | trunc
        buf["next_observation"][t] = obs
        buf["reward"][t] = r
        buf["terminated"][t] = term
        buf["truncated"][t] = trunc
    times = [*batch_ends, time.perf_counter()]
    episodes = int(np.count_nonzero(buf["terminated"] | buf["truncated"]))
    results.put((times[-1] - t0, quickest_batch(times), episodes, steady_batch(times)))
    venv.close()


QUICKEST_WINDOW = 2
"""Batches per window of :func:`quickest_batch`: a handle the learner took late makes the next
one look early, which a window of two halves."""


def quickest_batch(times: list[float], window: int = QUICKEST_WINDOW) -> float:
    """The shortest time per batch over ``window`` consecutive batches, from
    ``times`` (the start, then the end of each batch). A shared VM's speed swings within
    seconds (here between about 24k and 44k greedy Pendulum frames/s, from one 0.1 s stretch
    to the next), so the quickest batches of many compare two loops where the machine did not
    slow either."""
    w = min(window, len(times) - 1)
    return min((times[k + w] - times[k]) / w for k in range(len(times) - w))


def steady_batch(times: list[float], first: int = 1) -> float:
    """Seconds per batch after the ``first`` ones, from ``times`` (the start, then the end of
    each batch): the rate of a long run, without the first batch's warm-up (or, for daskrl,
    the pipeline's fill: ``times`` are the handles' arrivals, ``first`` those of one task)."""
    first = max(1, min(first, len(times) - 2))  # (a warm-up run of one task: not used)
    return (times[-1] - times[first]) / (len(times) - 1 - first)


class Ceiling(NamedTuple):
    """One run of ``n`` ceiling processes at once."""

    fps: float
    """All frames over the slowest process's time."""
    quickest: list[float]
    """Each process's quickest batch-sized stretch of steps (seconds), sorted."""
    episodes_per_kframe: float
    """Episodes they ended per 1,000 frames."""
    steady_fps: float
    """Their steady frames/s (:func:`steady_batch`, summed)."""


def run_ceiling(env_id: str, n: int, steps: int, loop=ceiling_loop, *extra) -> Ceiling:
    """A run of ``n`` ceiling processes running at once (:class:`Ceiling`)."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(n), ctx.Queue()
    saved = {k: os.environ.get(k) for k in THREAD_VARS}
    os.environ.update(dict.fromkeys(THREAD_VARS, "1"))  # inherited by the spawned children
    try:
        procs = [
            ctx.Process(target=loop, args=(env_id, steps, s, barrier, results, *extra))
            for s in range(n)
        ]
        for p in procs:
            p.start()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    times, quickest, episodes, steady = zip(*(results.get(timeout=600) for _ in procs))
    for p in procs:
        p.join()
        if p.exitcode:
            raise RuntimeError(f"ceiling process exited with {p.exitcode}")
    frames = n * steps * ENVS_PER_WORKER
    return Ceiling(frames / max(times), sorted(quickest), 1000 * sum(episodes) / frames,
                   sum(FRAMES_PER_BATCH / s for s in steady))


def _envpool_factory(env_id: str):
    import envpool

    import daskrl

    return envpool.make_gymnasium(env_id, num_envs=ENVS_PER_WORKER, seed=daskrl.env_seed())


def _workloads(envs: list[str], policies: list[str], vector: bool = False
               ) -> list[tuple[str, str]]:
    """``(env, policy)`` of each env and policy that runs on it (others are named, and left
    out)."""
    out = []
    for e in envs:
        probe = make_vector_env(e) if vector else gym.make(e)
        space = probe.single_action_space if vector else probe.action_space
        probe.close()
        for k in policies:
            if supports(k, space):
                out.append((e, k))
            else:
                print(f"{e}{' (vector)' if vector else ''}: no {k} workload (its action space "
                      f"is {space}; the GRU samples Discrete actions)")
    return out


def daskrl_workload(env_id: str, n: int, vector: bool = False, policy_kind: str = "sampling"
                    ) -> tuple[object, torch.nn.Module, dict]:
    """``(env, policy, Collector keywords)`` of a workload. ``vector``: ``env_id`` as a
    vector env (:func:`make_vector_env`)."""
    kw = dict(envs_per_worker=ENVS_PER_WORKER, frames_per_batch=FRAMES_PER_BATCH, num_workers=n)
    env: object = env_id
    if vector:
        probe = make_vector_env(env_id)
        obs_space, act_space = probe.single_observation_space, probe.single_action_space
        probe.close()
        if env_id.startswith("envpool:"):
            env = functools.partial(_envpool_factory, env_id.partition(":")[2])
            del kw["envs_per_worker"]  # the pool's num_envs
        else:
            kw["vectorization_mode"] = "vector_entry_point"
    else:
        probe = gym.make(env_id)
        obs_space, act_space = probe.observation_space, probe.action_space
        probe.close()
    return env, make_policy(policy_kind, obs_space, act_space), kw


def run_daskrl(client: Client, workload: tuple[object, torch.nn.Module, dict], url: str,
               batches: int, sync: bool) -> dict:
    """One collector run of ``batches`` batches per worker into a new store at ``url``,
    timed from just before iterating to the last handle (``batches=2``: a warm-up)."""
    env, policy, kw = workload
    n = kw["num_workers"]
    collector = Collector(env, policy, url, client=client, rounds=sync,
                          total_frames=batches * n * FRAMES_PER_BATCH, **kw)
    arrivals: dict[str, list[float]] = {}  # worker -> when the learner got each of its handles
    handles = []
    with collector:
        t0 = time.perf_counter()
        for h in collector:
            arrivals.setdefault(h.worker, [t0]).append(time.perf_counter())
            handles.append(h)
        wall = time.perf_counter() - t0
    # The committed batches' bytes on disk (containers and commit records), default codec.
    stored = sum(f.stat().st_size for f in Path(url).rglob("*") if f.is_file())
    frames = sum(h.frames for h in handles)
    rollout = sum(h.rollout_seconds for h in handles)
    write = sum(h.write_seconds for h in handles)
    return {
        "fps": frames / wall,
        "wall_s": wall,
        "batches": len(handles),
        "rollout_s_per_batch": rollout / len(handles),
        "write_s_per_batch": write / len(handles),
        # wall time per batch on one worker not spent in rollout or write: scheduling, pickling...
        "other_s_per_batch": wall * n / len(handles) - (rollout + write) / len(handles),
        "rollout_fps_per_worker": frames / rollout,
        "store_bytes_per_frame": stored / frames,
        # the workload's episode rate, to compare with the ceiling's (same policy weights)
        "episodes_per_kframe": 1000 * sum(len(h.episode_lengths) for h in handles) / frames,
        # per worker, its quickest batches as the learner got them (its first from the start):
        # a batch's whole cost, pipeline included, when the machine did not slow it
        "quickest_s": sorted(quickest_batch(a, QUICKEST_WINDOW)
                             for a in arrivals.values()),
        # each worker's handles after its first, over the time since (summed): a long run's
        # rate, without the first batch's latency (start-up is bench_startup's)
        "steady_fps": (sum(FRAMES_PER_BATCH / steady_batch(a, 1) for a in arrivals.values())
                       if all(len(a) - 1 > 1 for a in arrivals.values()) else math.nan),
    }


def quickest_fps(quickest: list[list[float]]) -> float:
    """Frames/s at each worker's (or ceiling process's) quickest batch over all repeats:
    ``quickest`` holds, per repeat, the quickest batch time of each, sorted."""
    return sum(FRAMES_PER_BATCH / min(ts) for ts in zip(*quickest))


def summary(runs: list[dict], ceilings: list[Ceiling]) -> dict:
    """The median run of a workload's repeats (by its ratio to the ceiling measured just
    before it), with every repeat's ratio, and the ratio of quickest batches (see
    :func:`quickest_fps`)."""
    ratios = [r["fps"] / c.fps for r, c in zip(runs, ceilings)]
    steady = [r["steady_fps"] / c.steady_fps for r, c in zip(runs, ceilings)]
    median = sorted(range(len(runs)), key=lambda i: ratios[i])[len(runs) // 2]
    quickest = (quickest_fps([r["quickest_s"] for r in runs])
                / quickest_fps([c.quickest for c in ceilings]))
    return {**runs[median], "ratio": float(np.median(ratios)), "ratios": ratios,
            "ceiling_fps": ceilings[median].fps, "quickest_ratio": quickest,
            "ceiling_episodes_per_kframe": float(np.median([c.episodes_per_kframe
                                                            for c in ceilings])),
            "steady_ratio": float(np.median(steady)), "steady_ratios": steady}


def spread(ratios: list[float]) -> str:
    """``0.91 [0.88-0.93]``: the median ratio and its range over the repeats."""
    if any(math.isnan(r) for r in ratios):
        return "n/a"  # not measured (steady: one task per worker)
    med = float(np.median(ratios))
    return f"{med:.2f} [{min(ratios):.2f}-{max(ratios):.2f}]" if len(ratios) > 1 else f"{med:.2f}"


def print_table(header: list[str], rows: list[list]) -> None:
    cells = [header] + [[f"{c:,.0f}" if isinstance(c, float) and c >= 100 else
                         f"{c:.3f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for j, r in enumerate(cells):
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if j == 0:
            print("  ".join("-" * w for w in widths))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1", "Pendulum-v1"])
    parser.add_argument("--vector-envs", nargs="*", default=None,
                        help="vector-env workloads: gymnasium ids with a vector entry point, "
                             "or envpool:ID (e.g. envpool:Pong-v5); 'none' for none (default, "
                             "or with the flag alone: " + " ".join(DEFAULT_VECTOR_ENVS)
                             + ", envpool's where it is installed)")
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--batches-per-worker", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=1,
                        help="time each workload's ceiling and daskrl runs this many times, "
                             "back to back; the tables give the median ratio and its range")
    parser.add_argument("--policies", nargs="+", choices=POLICIES,
                        default=list(DEFAULT_POLICIES),
                        help="MLPPolicy's sampling policy, its greedy (argmax) network, and/or "
                             "the recurrent GRUPolicy (Discrete actions only); vector envs run "
                             "those of " + ", ".join(VECTOR_POLICIES) + " (default: "
                             + " ".join(DEFAULT_POLICIES) + ")")
    parser.add_argument("--skip-no-tls", action="store_true",
                        help="no sync runs on a cluster without TLS (the price of TLS)")
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    args = parser.parse_args()
    steps = args.batches_per_worker * FRAMES_PER_BATCH // ENVS_PER_WORKER

    print(f"cpu count: {os.cpu_count()}; {ENVS_PER_WORKER} envs/worker, "
          f"{args.batches_per_worker} x {FRAMES_PER_BATCH} frames/worker, MLP {HIDDEN}")
    vector_envs = ([] if args.vector_envs == ["none"] else args.vector_envs
                   or default_vector_envs())
    results, vector_results = [], []
    workloads = _workloads(args.envs, args.policies)
    vector_workloads = _workloads(vector_envs, [k for k in args.policies if k in VECTOR_POLICIES],
                                  vector=True)
    b = args.batches_per_worker
    for n in args.workers:
        ceilings: dict[tuple[str, str], list[Ceiling]] = {w: [] for w in workloads}
        vector_ceilings: dict[tuple[str, str], list[Ceiling]] = {w: [] for w in vector_workloads}
        runs: dict[tuple[str, str], dict[str, list[dict]]] = {
            w: {"sync": [], "async": [], "sync_no_tls": []} for w in workloads}
        vector_runs: dict[tuple[str, str], list[dict]] = {w: [] for w in vector_workloads}
        setups = {w: daskrl_workload(w[0], n, policy_kind=w[1]) for w in workloads}
        vector_setups = {w: daskrl_workload(w[0], n, vector=True, policy_kind=w[1])
                         for w in vector_workloads}
        # The embedded cluster's default is TLS; the same runs without it price the encryption.
        for tls in (True,) if args.skip_no_tls else (True, False):
            with local_cluster(n, tls=tls) as cluster, Client(cluster) as client, \
                    tempfile.TemporaryDirectory(prefix="daskrl-bench-") as tmp:
                modes = (True, False) if tls else (True,)
                warm_ups = [(setup, modes) for setup in setups.values()]
                warm_ups += [(setup, (True,)) for setup in vector_setups.values()]
                for setup, warm_modes in warm_ups:
                    for sync in warm_modes:
                        run_daskrl(client, setup, f"{tmp}/warm-{len(os.listdir(tmp))}", 2, sync)
                # Each repeat times the ceiling and then daskrl on the same workload, one after
                # the other: the machine's speed drifts (a shared VM's by 10-20 % within a
                # minute), and a ratio of runs minutes apart would measure the drift.
                for rep in range(args.repeats):
                    for w in workloads:
                        if tls:
                            ceilings[w].append(run_ceiling(w[0], n, steps, ceiling_loop, w[1]))
                        for sync in modes:
                            key = ("sync" if sync else "async") if tls else "sync_no_tls"
                            runs[w][key].append(run_daskrl(
                                client, setups[w], f"{tmp}/{key}-{w[0]}-{w[1]}-{rep}", b, sync))
                    for w in vector_workloads if tls else ():
                        vector_ceilings[w].append(run_ceiling(w[0], n, steps,
                                                              vector_ceiling_loop, w[1]))
                        vector_runs[w].append(run_daskrl(
                            client, vector_setups[w], f"{tmp}/vector-{w[0]}-{w[1]}-{rep}", b,
                            True))
        summaries = {}
        for w in workloads:
            r = summaries[w] = {mode: summary(rs, ceilings[w]) for mode, rs in runs[w].items()
                                if rs}
            results.append({"env": w[0], "policy": w[1], "workers": n,
                            "ceiling_fps": float(np.median([c.fps for c in ceilings[w]])), **r})
            print(f"  done {w[0]} {w[1]} N={n}: sync/ceiling {spread(r['sync']['ratios'])} "
                  f"(steady {spread(r['sync']['steady_ratios'])}, quickest "
                  f"{r['sync']['quickest_ratio']:.2f}), async/ceiling "
                  f"{spread(r['async']['ratios'])} (steady {spread(r['async']['steady_ratios'])}"
                  f", quickest {r['async']['quickest_ratio']:.2f})", flush=True)
        for w in vector_workloads:
            r = {"env": w[0], "policy": w[1], "workers": n,
                 "ceiling_fps": float(np.median([c.fps for c in vector_ceilings[w]])),
                 "sync": summary(vector_runs[w], vector_ceilings[w])}
            if w in ceilings:  # the same env and policy as single envs
                r["single_ceiling_fps"] = float(np.median([c.fps for c in ceilings[w]]))
                r["single_sync_fps"] = summaries[w]["sync"]["fps"]
            vector_results.append(r)
            print(f"  done vector {w[0]} {w[1]} N={n}: daskrl/ceiling "
                  f"{spread(r['sync']['ratios'])} "
                  f"(steady {spread(r['sync']['steady_ratios'])}, quickest "
                  f"{r['sync']['quickest_ratio']:.2f})", flush=True)

    print()
    if results:
        print_table(["env", "policy", "workers", "ceiling frames/s", "daskrl sync",
                     "sync/ceiling", "steady", "quickest", "daskrl async", "async/ceiling",
                     "steady", "quickest", "sync no TLS", "TLS/no TLS"],
                    [[r["env"], r["policy"], r["workers"], r["ceiling_fps"], r["sync"]["fps"],
                      spread(r["sync"]["ratios"]), spread(r["sync"]["steady_ratios"]),
                      f"{r['sync']['quickest_ratio']:.2f}",
                      r["async"]["fps"], spread(r["async"]["ratios"]),
                      spread(r["async"]["steady_ratios"]), f"{r['async']['quickest_ratio']:.2f}",
                      r["sync_no_tls"]["fps"] if "sync_no_tls" in r else "-",
                      f"{r['sync']['fps'] / r['sync_no_tls']['fps']:.2f}"
                      if "sync_no_tls" in r else "-"] for r in results])
    if vector_results:
        print("\nvector envs (8 sub-envs per worker, sync mode; ceiling: the same vector env "
              "in a plain loop):")
        print_table(["env", "policy", "workers", "vector ceiling", "daskrl vector",
                     "daskrl/ceiling", "steady", "quickest", "store bytes/frame",
                     "single-env ceiling", "vector/single ceiling", "daskrl vector/single"],
                    [[r["env"], r["policy"], r["workers"], r["ceiling_fps"], r["sync"]["fps"],
                      spread(r["sync"]["ratios"]), spread(r["sync"]["steady_ratios"]),
                      f"{r['sync']['quickest_ratio']:.2f}",
                      f"{r['sync']['store_bytes_per_frame']:.1f}",
                      r.get("single_ceiling_fps", "-"),
                      f"{r['ceiling_fps'] / r['single_ceiling_fps']:.2f}"
                      if "single_ceiling_fps" in r else "-",
                      f"{r['sync']['fps'] / r['single_sync_fps']:.2f}"
                      if "single_sync_fps" in r else "-"] for r in vector_results])
    print("\ndaskrl time per batch (seconds, per worker), and the episodes ended per 1,000 "
          "frames by daskrl and by the ceiling (the same policy weights: the same workload):")
    print_table(["env", "workers", "mode", "rollout", "write", "other", "rollout frames/s/worker",
                 "episodes/1k", "ceiling episodes/1k"],
                [[f"{r['env']} {r['policy']}", r["workers"], mode, r[mode]["rollout_s_per_batch"],
                  r[mode]["write_s_per_batch"], r[mode]["other_s_per_batch"],
                  r[mode]["rollout_fps_per_worker"], f"{r[mode]['episodes_per_kframe']:.1f}",
                  f"{r[mode]['ceiling_episodes_per_kframe']:.1f}"]
                 for r in results for mode in ("sync", "async")]
                + [[f"{r['env']} {r['policy']} (vector)", r["workers"], "sync",
                    r["sync"]["rollout_s_per_batch"], r["sync"]["write_s_per_batch"],
                    r["sync"]["other_s_per_batch"], r["sync"]["rollout_fps_per_worker"],
                    f"{r['sync']['episodes_per_kframe']:.1f}",
                    f"{r['sync']['ceiling_episodes_per_kframe']:.1f}"] for r in vector_results])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu_count": os.cpu_count(), "batches_per_worker": args.batches_per_worker,
                       "repeats": args.repeats, "results": results,
                       "vector_results": vector_results}, f, indent=2)


if __name__ == "__main__":
    main()
