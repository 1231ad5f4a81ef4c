"""A TagPolicy whose output ``tag`` is a given value: shared by tests/test_host_copies.py and
tests/unit/test_host_copies.py."""

from __future__ import annotations

import torch

from daskrl.testing import TagPolicy


def tag_policy(value: float) -> torch.nn.Module:
    p = TagPolicy()
    with torch.no_grad():
        p.tag.fill_(value)
    return p
