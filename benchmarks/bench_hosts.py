"""Weights on many hosts: the learner's time per weights version vs hosts and workers per host.

Runs on the namespace hosts of ``tests/beds/hosts.py`` (root only): host 0 runs the scheduler
and the learner, hosts 1..H run W one-thread ``dask worker`` processes each (no worker shares
the learner's ``/dev/shm``, so weights go through Dask). For each (H, W) the learner publishes
``--versions`` versions of a float32 MLP of ``--mib`` MiB and times, per version (median):

- ``broadcast``: ``client.scatter([snapshot], broadcast=True)``, what daskrl did before: one
  copy per worker, sent by the learner;
- ``update``: ``collector.update_weights(policy)``, what the learner pays now (one copy to
  one seed worker; the others fetch when their next batch starts);
- ``update+load``: ``collector.update_weights(policy, wait=True)``: until every worker has
  fetched, verified and loaded the version.

    sudo python benchmarks/bench_hosts.py --hosts 1 2 3 4 --workers-per-host 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def learner(config_path: str) -> None:
    """On host 0: publish versions, time them, write the figures next to the config."""

    import daskrl
    from daskrl import deploy
    from daskrl.weights import snapshot

    cfg = json.loads(Path(config_path).read_text())
    import gymnasium as gym

    from daskrl.policies import MLPPolicy

    env = gym.make("CartPole-v1")
    width = int((cfg["mib"] * 2**20 / 4) ** 0.5)  # one width x width layer holds the bulk
    module = MLPPolicy(env.observation_space, env.action_space, hidden=(width, width))
    out: dict[str, list[float]] = {"broadcast": [], "update": [], "update+load": []}
    with (deploy.connect(cfg["address"]) as d,
          daskrl.Collector("CartPole-v1", module, cfg["store"], client=d.client,
                           envs_per_worker=1, frames_per_batch=8, total_frames=None) as c):
        client = d.client
        for v in range(cfg["versions"]):
            snap = snapshot(module, 10_000 + v)
            t0 = time.perf_counter()
            [fut] = client.scatter([snap], broadcast=True, hash=False, timeout=120)
            out["broadcast"].append(time.perf_counter() - t0)
            fut.release()
            del fut
            t0 = time.perf_counter()
            c.update_weights(module)
            out["update"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            c.update_weights(module, wait=True)
            out["update+load"].append(time.perf_counter() - t0)
        out["nbytes"] = [float(snap.nbytes)]
    Path(config_path).with_name("figures.json").write_text(json.dumps(out))


def measure(n_hosts: int, per_host: int, mib: float, versions: int) -> dict[str, float]:
    from beds.dask_hosts import dask_hosts

    with tempfile.TemporaryDirectory(prefix="bench-hosts-") as tmp:
        shared = Path(tmp) / "shared"
        with dask_hosts(shared, n_hosts + 1, workers_per_host=per_host) as cluster:
            cluster.wait_for_workers(n_hosts * per_host)
            ctl = shared / "bench"
            ctl.mkdir()
            (ctl / "config.json").write_text(json.dumps({
                "address": cluster.address, "store": str(shared / "store"), "mib": mib,
                "versions": versions}))
            proc = cluster.hosts.run(0, [sys.executable, __file__, "--learner",
                                         str(ctl / "config.json")],
                                     env=cluster.env, log=ctl / "learner.log")
            if proc.wait(timeout=900) or not (ctl / "figures.json").exists():
                raise RuntimeError((ctl / "learner.log").read_text()[-4000:])
            figures = json.loads((ctl / "figures.json").read_text())
    skip = 1 if versions > 2 else 0  # the first version allocates and maps: not steady state
    return {k: statistics.median(v[skip:]) if k != "nbytes" else v[0]
            for k, v in figures.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--workers-per-host", type=int, nargs="+", default=[1, 2])
    p.add_argument("--mib", type=float, default=32.0, help="policy size (MiB of float32)")
    p.add_argument("--versions", type=int, default=5)
    p.add_argument("--learner", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.learner:
        learner(args.learner)
        return
    if os.geteuid() != 0:
        sys.exit("bench_hosts.py needs root (network namespaces)")
    print(f"| hosts | workers/host | workers | broadcast (before) s | update_weights s | "
          f"update_weights(wait=True) s |  ({args.mib:g} MiB, median of "
          f"{max(1, args.versions - 1)} versions)")
    print("|---|---|---|---|---|---|")
    for per_host in args.workers_per_host:
        for n in args.hosts:
            f = measure(n, per_host, args.mib, args.versions)
            print(f"| {n} | {per_host} | {n * per_host} | {f['broadcast']:.3f} | "
                  f"{f['update']:.3f} | {f['update+load']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
