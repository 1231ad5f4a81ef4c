"""Cost of broadcasting one weights version to the workers, against the floor of copying bytes.

A policy of ``--params`` float32 parameters (default 25M, ~100 MB) is published with
``Collector.update_weights(policy, wait=True)``, which returns once every worker has fetched,
checksum-verified and loaded it onto its device: through shared memory (the default for
workers on the learner's machine) and, with ``shared_memory=False``, as a Dask transfer (what
workers on other machines get), each on the embedded cluster with and without TLS. In the same
run, for the same bytes:

* copy floor: one ``memcpy`` of the state per worker (``numpy.copyto`` into a preallocated
  buffer): what any broadcast must at least do;
* torch.save: serializing the state dict to bytes once per worker (what pipe/pickle-based
  collectors do), without even sending it.

The ratio daskrl / floor is per worker: broadcast time / (workers x one copy). Timings are of
the steady state (the best of ``--repeats`` versions after two untimed ones): the first versions
also allocate the learner's buffers (or shared-memory files) and fault in the workers' mappings.

Run:  python benchmarks/bench_weights.py [--params 25000000] [--workers 2] [--repeats 5]
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time

import numpy as np
import torch
from distributed import Client
from torch import nn

from daskrl import Collector
from daskrl.deploy import local_cluster
from daskrl.weights import snapshot


class BigPolicy(nn.Module):
    """One big weight matrix; always action 0 (the env does not matter here)."""

    def __init__(self, params: int) -> None:
        super().__init__()
        side = int(params ** 0.5)
        self.weight = nn.Parameter(torch.randn(side, side))
        self.bias = nn.Parameter(torch.randn(params - side * side))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.zeros(obs.shape[0], dtype=torch.int64)


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=25_000_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    policy = BigPolicy(args.params)
    state = [p.detach().numpy() for p in policy.parameters()]
    nbytes = sum(a.nbytes for a in state)
    dest = [np.empty_like(a) for a in state]

    def copy_once() -> None:
        for d, a in zip(dest, state):
            np.copyto(d, a)

    def torch_save_once() -> None:
        torch.save(policy.state_dict(), io.BytesIO())

    copy_s = best(copy_once, args.repeats)
    save_s = best(torch_save_once, args.repeats)
    spare = snapshot(policy, 0)
    snap_s = best(lambda: snapshot(policy, 0, out=dict(zip(spare.names, spare.arrays))),
                  args.repeats)
    daskrl_s = {}
    for tls in (True, False):  # the embedded cluster's default is TLS
        with local_cluster(args.workers, tls=tls) as cluster, Client(cluster) as client:
            for shared in (True, False):
                with (
                    tempfile.TemporaryDirectory() as tmp,
                    Collector("daskrl.testing:Counting-v0", policy, tmp, client=client,
                              envs_per_worker=1, frames_per_batch=1, total_frames=None,
                              shared_memory=shared) as collector,
                ):
                    assert collector.weights_transport == ("shared-memory" if shared
                                                           else "dask")
                    for _ in range(2):  # steady state: buffers and mappings exist
                        collector.update_weights(policy, wait=True)
                    daskrl_s[tls, shared] = best(
                        lambda c=collector: c.update_weights(policy, wait=True), args.repeats)

    n = args.workers
    print(f"state: {nbytes / 2**20:.0f} MiB float32, {n} workers, best of {args.repeats}")
    rows = [
        ("copy floor (1 memcpy per worker)", n * copy_s),
        ("torch.save to bytes (1 per worker)", n * save_s),
        ("daskrl, shared memory, TLS (default)", daskrl_s[True, True]),
        ("daskrl, shared memory, no TLS", daskrl_s[False, True]),
        ("daskrl, Dask transfer, TLS", daskrl_s[True, False]),
        ("daskrl, Dask transfer, no TLS", daskrl_s[False, False]),
        ("  of which: snapshot + checksums (learner)", snap_s),
    ]
    floor = n * copy_s
    print(f"{'method':42s} {'seconds':>8s} {'per worker':>10s} {'x floor':>8s}")
    for name, s in rows:
        print(f"{name:42s} {s:8.3f} {s / n:10.3f} {s / floor:8.2f}")


if __name__ == "__main__":
    main()
