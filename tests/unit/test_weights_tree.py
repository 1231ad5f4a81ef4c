"""The fan-out tree's shape and its parent's turns, without a cluster: every host of H is
reached in ceil(log2 H) rounds with one copy each, a parent sends one child a round, the hosts
are ranked seed first with one worker each, and a parent serves waiting children lowest rank
first. (On real workers: tests/test_weights_tree.py.)"""

from __future__ import annotations

import asyncio
import math

import pytest

from daskrl.weights._tree import _Turns, host_rank, parent_rank, tree_hosts


@pytest.mark.parametrize("n_hosts", [1, 2, 3, 4, 5, 7, 8, 9, 100, 1000])
def test_every_host_holds_the_version_after_log2_rounds(n_hosts):
    held_at = {0: 0}  # rank -> the round it holds the version from
    sent = {}  # (parent, round) -> child
    for rank in range(1, n_hosts):
        parent = parent_rank(rank)
        assert parent < rank
        at = rank.bit_length()  # the round its parent sends it
        assert held_at[parent] < at  # the parent holds it before
        assert (parent, at) not in sent  # and sends one child a round
        sent[parent, at] = rank
        held_at[rank] = at
    assert len(held_at) == n_hosts  # every host, once
    assert max(held_at.values()) == math.ceil(math.log2(n_hosts))


def test_hosts_are_ranked_seed_first_with_one_worker_each():
    workers = ["tcp://10.0.0.3:2", "tcp://10.0.0.2:9", "tcp://10.0.0.2:1", "tcp://10.0.0.1:5",
               "tcp://10.0.0.3:1"]
    tree = tree_hosts(workers, "tcp://10.0.0.3:2")
    assert tree == ("tcp://10.0.0.3:2", "tcp://10.0.0.1:5", "tcp://10.0.0.2:1")
    assert host_rank(tree, "tcp://10.0.0.3:1") == 0  # the seed's host
    assert host_rank(tree, "tcp://10.0.0.2:9") == 2
    assert host_rank(tree, "tcp://10.0.0.4:1") is None  # joined after
    with pytest.raises(ValueError):
        parent_rank(0)


def test_a_parent_serves_waiting_children_lowest_rank_first():
    async def main() -> list[int]:
        turns, served = _Turns(), []

        async def child(rank: int) -> None:
            await turns.take(rank)
            served.append(rank)
            await asyncio.sleep(0.01)
            turns.give()

        first = asyncio.create_task(child(8))
        await asyncio.sleep(0)  # 8 takes the free link
        rest = [asyncio.create_task(child(r)) for r in (4, 1, 2)]
        cancelled = asyncio.create_task(child(3))
        await asyncio.sleep(0)
        cancelled.cancel()  # gave up waiting (its deadline): skipped
        await asyncio.gather(first, *rest, return_exceptions=True)
        await asyncio.gather(cancelled, return_exceptions=True)
        assert not turns.busy
        return served

    assert asyncio.run(main()) == [8, 1, 2, 4]
