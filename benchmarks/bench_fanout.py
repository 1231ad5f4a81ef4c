"""Weights fan-out: the time until every host holds a version, tree against star, vs hosts.

Each host's outgoing link is a real rate-limited link (Linux ``tc``), so that what is measured
is the shape of the fan-out, not this machine's two cores: the star (every host fetches from
the seed, ``daskrl.weights.tree=False``, what daskrl did before) sends ``H - 1`` copies over the
seed's link one after another; the tree sends one copy a round from each holder. Per version:
``update_weights(policy, wait=True)``, until every worker has fetched, verified and loaded it
(the learner's one copy to the seed included). Both shapes alternate, version by version, in
one run; medians over ``--versions`` each.

- ``--hosts H ...``: the namespace hosts of ``tests/beds/hosts.py`` (root only): host 0 runs
  the scheduler and the learner, hosts 1..H one ``dask worker`` each; each host's ``eth0``
  sends at ``--rate`` (``tc tbf``).
- ``--simulate H ...``: H simulated hosts, real ``distributed.Worker``s many to a process, each
  on a loopback address of its own (``127.0.1.<i>``) inside a private network namespace whose
  loopback sends each address's traffic at ``--sim-rate`` (``tc htb``, one class per address),
  each with a host-copy directory of its own (its ``/dev/shm``) and a Dask client of its own
  (a process's workers share one, which gathers a key once for all): the two things patched.

    sudo python benchmarks/bench_fanout.py --hosts 2 3 4 --simulate 10 30 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_simulate import THREADS_ENV  # noqa: E402  (the processes' environment)


def learner(address: str, store: str, mib: float, versions: int,
            workers: int) -> dict[str, list[float]]:
    """Publish ``versions`` versions per shape with ``wait=True``, alternating; seconds each."""
    import dask
    import gymnasium as gym
    from distributed import Client

    import daskrl
    from daskrl.policies import MLPPolicy

    env = gym.make("CartPole-v1")
    width = int((mib * 2**20 / 4) ** 0.5)  # one width x width layer holds the bulk
    module = MLPPolicy(env.observation_space, env.action_space, hidden=(width, width))
    out: dict[str, list[float]] = {"star": [], "tree": []}
    with Client(address, timeout=120) as client:
        client.wait_for_workers(workers, timeout=300)
        with daskrl.Collector("CartPole-v1", module, store, client=client,
                              shared_memory=False, envs_per_worker=1, frames_per_batch=8,
                              total_frames=None, call_timeout=300) as c:
            c.update_weights(module, wait=True)  # the first: every worker maps and allocates
            for _ in range(versions):
                for shape in ("star", "tree"):
                    with dask.config.set({"daskrl.weights.tree": shape == "tree"}):
                        t0 = time.perf_counter()
                        c.update_weights(module, wait=True)
                        out[shape].append(time.perf_counter() - t0)
            sources = client.run(lambda dask_worker: [
                s for p in dask_worker.plugins.values() if hasattr(p, "weight_sources")
                for s in p.weight_sources])
    out["sources"] = sorted({s for loaded in sources.values() for _, s in loaded})  # type: ignore
    return out


# -- namespace hosts ----------------------------------------------------------------------------

def measure_hosts(n_hosts: int, mib: float, versions: int, rate: str) -> dict:
    from beds.dask_hosts import dask_hosts

    with tempfile.TemporaryDirectory(prefix="bench-fanout-") as tmp:
        shared = Path(tmp) / "shared"
        with dask_hosts(shared, n_hosts + 1, workers_per_host=1) as cluster:
            for i in range(n_hosts + 1):
                cluster.hosts.check(i, ["tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
                                        "rate", rate, "burst", "1mb", "latency", "1s"])
            cluster.wait_for_workers(n_hosts)
            ctl = shared / "bench"
            ctl.mkdir()
            out = ctl / "figures.json"
            proc = cluster.hosts.run(0, [sys.executable, __file__, "--learner", cluster.address,
                                         str(shared / "store"), str(mib), str(versions),
                                         str(n_hosts), str(out)],
                                     env={**cluster.env, **THREADS_ENV}, log=ctl / "learner.log")
            if proc.wait(timeout=1800) or not out.exists():
                raise RuntimeError((ctl / "learner.log").read_text()[-4000:])
            return json.loads(out.read_text())


# -- simulated hosts ----------------------------------------------------------------------------

def sim_address(i: int) -> str:
    return f"127.0.1.{i + 1}"


async def serve(address: str, first: int, n: int, shm: str) -> None:
    """Run workers for simulated hosts ``first .. first + n - 1`` on this event loop, each
    keeping its host copies in a directory of its own."""
    from distributed import Client, Worker, get_worker

    from daskrl.weights import _cache as weights_cache
    from daskrl.weights._cache import WeightsCache

    attach = WeightsCache.attach

    def attach_on_own_host(self: WeightsCache, worker: Worker) -> None:
        host = worker.address.split("//")[1].split(":")[0]
        self.host_copies.directory = os.path.join(shm, host)
        os.makedirs(self.host_copies.directory, exist_ok=True)
        attach(self, worker)

    WeightsCache.attach = attach_on_own_host  # type: ignore[method-assign]
    clients: dict[str, Client] = {}

    def own_client() -> Client:
        # Workers of one process share distributed's default client, which gathers a key
        # once for all of them: simulated hosts would share their fetches from the seed.
        worker = get_worker()
        if worker.address not in clients:
            clients[worker.address] = Client(worker.scheduler.address, loop=worker.loop,
                                             security=worker.security, set_as_default=False,
                                             direct_to_workers=True, name=worker.name)
        return clients[worker.address]

    weights_cache.worker_client = own_client  # type: ignore[attr-defined]
    workers = [Worker(address, nthreads=1, name=f"sim-{i}", memory_limit=0, dashboard=False,
                      host=sim_address(i)) for i in range(first, first + n)]
    await asyncio.gather(*workers)
    await asyncio.gather(*(w.finished() for w in workers))


def simulate_inner(n_hosts: int, mib: float, versions: int, processes: int, out: str) -> None:
    """Inside the shaped namespace: a scheduler, the workers, the learner (this process)."""
    from cli_cluster import Processes, scheduler_address, scheduler_args, wait_for_file

    with tempfile.TemporaryDirectory(prefix="bench-fanout-sim-") as tmp:
        procs = Processes(Path(tmp))
        shm = tempfile.mkdtemp(prefix="drl-fanout-", dir="/dev/shm")
        try:
            sched = Path(tmp) / "scheduler.json"
            procs.start("scheduler", scheduler_args(sched), THREADS_ENV)
            wait_for_file(sched, procs)
            address = scheduler_address(sched)
            per = [n_hosts // processes + (i < n_hosts % processes) for i in range(processes)]
            first = 0
            for p, k in enumerate(per):
                if k:
                    procs.start(f"hosts-{p}", [sys.executable, __file__, "--serve", address,
                                               str(first), str(k), shm], THREADS_ENV)
                first += k
            figures = learner(address, f"{tmp}/store", mib, versions, n_hosts)
        finally:
            procs.kill_all()
            subprocess.run(["rm", "-rf", shm], check=False)
    Path(out).write_text(json.dumps(figures))


def simulate(n_hosts: int, mib: float, versions: int, rate: str, processes: int) -> dict:
    ns = f"drl-fanout-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        def tc(*args: str) -> None:
            subprocess.run(["ip", "netns", "exec", ns, "tc", *args], check=True)

        subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"], check=True)
        tc("qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "1")
        tc("class", "add", "dev", "lo", "parent", "1:", "classid", "1:1", "htb", "rate",
           "100gbit")
        for i in range(n_hosts):
            tc("class", "add", "dev", "lo", "parent", "1:", "classid", f"1:{100 + i}", "htb",
               "rate", rate, "ceil", rate, "burst", "256k", "cburst", "256k")
            tc("filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", "1",
               "u32", "match", "ip", "src", f"{sim_address(i)}/32", "flowid", f"1:{100 + i}")
        with tempfile.TemporaryDirectory() as tmp:
            out = f"{tmp}/figures.json"
            subprocess.run(["ip", "netns", "exec", ns, sys.executable, __file__,
                            "--simulate-inner", str(n_hosts), str(mib), str(versions),
                            str(processes), out], check=True, timeout=3600,
                           env={**os.environ, **THREADS_ENV})
            return json.loads(Path(out).read_text())
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        asyncio.run(serve(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]))
        return
    if sys.argv[1:2] == ["--learner"]:
        address, store, mib, versions, workers, out = sys.argv[2:8]
        figures = learner(address, store, float(mib), int(versions), int(workers))
        Path(out).write_text(json.dumps(figures))
        return
    if sys.argv[1:2] == ["--simulate-inner"]:
        n, mib, versions, processes, out = sys.argv[2:7]
        simulate_inner(int(n), float(mib), int(versions), int(processes), out)
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, nargs="*", default=[2, 3, 4])
    p.add_argument("--mib", type=float, default=100.0)
    p.add_argument("--rate", default="1gbit", help="each namespace host's link")
    p.add_argument("--simulate", type=int, nargs="*", default=[10, 30, 100])
    p.add_argument("--sim-mib", type=float, default=10.0)
    p.add_argument("--sim-rate", default="100mbit", help="each simulated host's link")
    p.add_argument("--processes", type=int, default=4, help="processes of simulated hosts")
    p.add_argument("--versions", type=int, default=3, help="per shape")
    p.add_argument("--json")
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_fanout.py needs root (network namespaces, tc)")
    rows = []
    runs = [("namespace", h, args.mib, args.rate) for h in args.hosts] + \
        [("simulated", h, args.sim_mib, args.sim_rate) for h in args.simulate]
    for kind, h, mib, rate in runs:
        if kind == "namespace":
            f = measure_hosts(h, mib, args.versions, rate)
        else:
            f = simulate(h, mib, args.versions, rate, min(args.processes, h))
        row = {"kind": kind, "hosts": h, "mib": mib, "rate": rate, **f,
               "star_s": statistics.median(f["star"]), "tree_s": statistics.median(f["tree"])}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n{'hosts':>9} {'':>5} {'MiB':>5} {'link':>8} {'star s':>7} {'tree s':>7} "
          f"{'star/tree':>9} {'log2 H':>6}   (median of {args.versions} versions each)")
    for r in rows:
        print(f"{r['kind']:>9} {r['hosts']:5d} {r['mib']:5g} {r['rate']:>8} {r['star_s']:7.2f} "
              f"{r['tree_s']:7.2f} {r['star_s'] / r['tree_s']:9.2f} "
              f"{math.ceil(math.log2(r['hosts'])):6d}   {r['star']} {r['tree']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
