"""Workers rebuild the policy from its meta-device structure without torch's Python reference
kernels: ``to_empty`` on meta tensors imported sympy (about 1 s of each worker's start-up)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)

_SCRIPT = textwrap.dedent("""
    import sys
    import gymnasium as gym
    import torch
    from daskrl.policies import MLPPolicy
    from daskrl.weights._snapshot import load_weights, policy_spec, snapshot

    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = MLPPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
            self.wt = torch.nn.Parameter(torch.randn(3, 5).t())   # dense, not contiguous
            self.frozen = torch.nn.Parameter(torch.randn(2), requires_grad=False)
            self.register_buffer("h16", torch.randn(6, dtype=torch.float16))
            self.tied = self.wt                                    # an alias

    src = Odd()
    spec = policy_spec(src, None)
    built = spec.build("cpu")
    assert "sympy" not in sys.modules, "building the policy imported sympy"
    ref = dict(src.named_parameters(remove_duplicate=False))
    ref.update(src.named_buffers(remove_duplicate=False))
    got = dict(built.named_parameters(remove_duplicate=False))
    got.update(built.named_buffers(remove_duplicate=False))
    assert sorted(ref) == sorted(got), (sorted(ref), sorted(got))
    for name, t in ref.items():
        g = got[name]
        assert g.device.type == "cpu", name
        assert (g.shape, g.dtype, g.stride()) == (t.shape, t.dtype, t.stride()), name
        assert type(g) is type(t) and g.requires_grad == t.requires_grad, name
    assert built.tied is built.wt
    load_weights(built, snapshot(src, 0))
    for name, t in ref.items():
        assert torch.equal(got[name], t), name
    x = torch.randn(8, 4)
    torch.manual_seed(0); a = src.body(x)["action"]
    torch.manual_seed(0); b = built.body(x)["action"]
    assert torch.equal(a, b)
    print("ok")
""")


def test_build_from_structure_keeps_layout_and_imports_no_sympy() -> None:
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                         timeout=110)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "ok"
