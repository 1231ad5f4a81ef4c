"""The readers of ``daskrl.data`` and ``to_torchrl`` on batches of recurrent policies collected
on in-process clusters: ``is_init`` and a per-step ``policy_state`` read as any array, a
per-batch ``policy_state`` ``[E, ...]`` placed where it belongs, dataset samples that carry the
state before their first step, and TorchRL's ``GRUModule`` replaying a batch exactly."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import daskrl
import daskrl.data as dd
from daskrl.testing import GRUPolicy, StepCountPolicy

COUNTING = "daskrl.testing:Counting-v0"  # episodes of 5 steps


def _collect(client, tmp_path, policy=None, **options):
    options = {"num_workers": 2, "envs_per_worker": 3, "frames_per_batch": 21,
               "total_frames": 21 * 4, **options}
    url = str(tmp_path / "s")
    with daskrl.Collector(COUNTING, policy or StepCountPolicy(), url, client=client,
                          **options) as c:
        for _ in c:
            pass
    return daskrl.open_store(url)


def _steps(state):
    """The step count a StepCountPolicy state holds (tensor ``[..., 1]`` or mapping)."""
    return state["steps"] if isinstance(state, dict) else state[..., 0]


@pytest.mark.parametrize("mapping", [False, True])
def test_views_place_a_per_batch_state_along_envs(inproc_client, tmp_path, mapping):
    store = _collect(inproc_client, tmp_path, StepCountPolicy(mapping=mapping))
    name = "policy_state/steps" if mapping else "policy_state"
    assert not any(k.startswith("policy_state") for k in dd.to_dask(store))  # frames: left out
    d = dd.to_dask(store, ["policy_state", "step"], layout="env")
    state = d[name].compute()
    if not mapping:
        state = state[..., 0]
    assert np.array_equal(state, d["step"].compute()[0])  # [sum E]: each batch's first row
    ds = dd.to_xarray(store, ["policy_state", "step", "is_init"])
    assert ds[name].dims[0] == "batch_env" and ds[name].sizes["batch_env"] == 4 * 3
    assert ds["is_init"].dims == ("frame",)
    assert np.array_equal(ds["is_init"].values, ds["step"].values == 0)
    env = dd.to_xarray(store, layout="env")
    assert env[name].dims[0] == "env" and env[name].sizes["env"] == env["step"].sizes["env"]
    for h in store:
        one = dd.batch_to_xarray(h)
        assert one[name].dims[0] == "env"
        first = one[name].values if mapping else one[name].values[..., 0]
        assert np.array_equal(first, one["step"].values[0])


def test_episodes_leave_a_per_batch_state_out(inproc_client, tmp_path):
    store = _collect(inproc_client, tmp_path)
    eps = list(dd.episodes(store))
    assert eps and all("policy_state" not in e.data for e in eps)
    for e in eps:
        assert e.data["is_init"].tolist() == [True] + [False] * (e.length - 1)
    with pytest.raises(daskrl.ConfigError, match="stores policy_state once"):
        list(dd.episodes(store, ["policy_state"]))


def test_episodes_and_views_read_a_per_step_state(inproc_client, tmp_path):
    store = _collect(inproc_client, tmp_path, store_policy_state="every_step")
    for e in dd.episodes(store):
        assert torch.equal(e.data["policy_state"][:, 0], e.data["step"])
    ds = dd.to_xarray(store, layout="time")
    assert ds["policy_state"].dims == ("time", "env", "policy_state_0")
    assert np.array_equal(ds["policy_state"].values[..., 0], ds["step"].values)


def test_a_view_does_not_join_both_forms(inproc_client, tmp_path):
    _collect(inproc_client, tmp_path, total_frames=42)
    store = _collect(inproc_client, tmp_path, total_frames=42, store_policy_state="every_step")
    forms = [r.get("policy_state") for r in store.records().values()]
    assert forms == ["first"] * 2 + ["every_step"] * 2
    with pytest.raises(daskrl.StoreError, match=re.escape(
            "a view cannot join arrays of both forms")):
        dd.to_dask(store, ["policy_state"])
    ids = store.batch_ids()
    assert dd.to_dask(store, ["policy_state"], batch_ids=ids[:2])["policy_state"].shape == (6, 1)
    assert dd.to_dask(store, ["policy_state"], batch_ids=ids[2:])["policy_state"].shape == (42, 1)
    assert "policy_state" not in dd.to_dask(store, ["step"])


@pytest.mark.parametrize("form", ["first", "every_step"])
def test_sequences_carry_the_state_before_their_first_step(inproc_client, tmp_path, form):
    store = _collect(inproc_client, tmp_path, store_policy_state=form)
    keys = ["policy_state", "step", "is_init"]
    ds = dd.TransitionDataset(store, keys, sequence_length=4)
    # per batch [7, 3]: every window start, or t = 0 only where the state is stored once
    assert len(ds) == 4 * (3 if form == "first" else 4 * 3)
    b = ds.get_batch(list(range(len(ds))))
    assert b["policy_state"].shape == (len(ds), 1) and b["step"].shape == (len(ds), 4)
    assert torch.equal(b["policy_state"][:, 0], b["step"][:, 0])
    assert torch.equal(b["is_init"], b["step"] == 0)
    one = ds[len(ds) - 1]
    assert torch.equal(one["policy_state"][0], one["step"][0])
    if form == "first":  # left out by default, so windows start anywhere
        assert len(dd.TransitionDataset(store, sequence_length=4)) == 4 * 4 * 3
    replay = dd.ReplayDataset(store, keys, sequence_length=4, batch_size=32, num_samples=64,
                              seed=1)
    for m in replay:
        assert torch.equal(m["policy_state"][:, 0], m["step"][:, 0])


@pytest.mark.parametrize("form", ["first", "every_step"])
def test_a_torchrl_gru_module_replays_a_batch(inproc_client, tmp_path, form):
    pytest.importorskip("torchrl")
    from torchrl.modules import GRUModule, set_recurrent_mode

    from daskrl.integrations.torchrl import to_torchrl

    torch.manual_seed(0)
    policy = GRUPolicy(2, 2, hidden=8)
    store = _collect(inproc_client, tmp_path, policy, store_policy_state=form)
    gru = GRUModule(input_size=2, hidden_size=8, in_key="observation", out_key="h")
    with torch.no_grad():
        for ours, theirs in (("weight_ih", "weight_ih_l0"), ("weight_hh", "weight_hh_l0"),
                             ("bias_ih", "bias_ih_l0"), ("bias_hh", "bias_hh_l0")):
            getattr(gru.gru, theirs).copy_(getattr(policy.cell, ours))
    for h in store:
        batch = h.load()
        td = to_torchrl(batch, env_first=True, state_form=form)
        assert td["recurrent_state"].shape == (3, 7, 1, 8)
        assert torch.equal(td["is_init"][..., 0], batch["is_init"].T)
        with torch.no_grad(), set_recurrent_mode(True):
            out = gru(td.clone())
        logits = policy.head(out["h"])
        assert torch.allclose(logits, batch["logits"].transpose(0, 1), atol=1e-5), h.batch_id


class _LSTMPolicy(torch.nn.Module):
    """An LSTM policy whose state is the mapping ``{"h", "c"}``, TorchRL's LSTM state names."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.LSTMCell(2, 6)
        self.head = torch.nn.Linear(6, 2)

    def initial_state(self, num_envs):
        return {"h": torch.zeros(num_envs, 6), "c": torch.zeros(num_envs, 6)}

    def forward(self, obs, state):
        h, c = self.cell(obs.float(), (state["h"], state["c"]))
        logits = self.head(h)
        action = torch.distributions.Categorical(logits=logits).sample()
        return {"action": action, "logits": logits}, {"h": h, "c": c}


def test_a_torchrl_lstm_module_replays_a_mapping_state(inproc_client, tmp_path):
    pytest.importorskip("torchrl")
    from torchrl.modules import LSTMModule, set_recurrent_mode

    from daskrl.integrations.torchrl import to_torchrl

    torch.manual_seed(0)
    policy = _LSTMPolicy()
    store = _collect(inproc_client, tmp_path, policy)
    lstm = LSTMModule(input_size=2, hidden_size=6, in_key="observation", out_key="h")
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(lstm.lstm, f"{name}_l0").copy_(getattr(policy.cell, name))
    for h in store:
        batch = h.load()
        td = to_torchrl(batch, env_first=True)
        assert td["recurrent_state_h"].shape == td["recurrent_state_c"].shape == (3, 7, 1, 6)
        with torch.no_grad(), set_recurrent_mode(True):
            out = lstm(td.clone())
        logits = policy.head(out["h"])
        assert torch.allclose(logits, batch["logits"].transpose(0, 1), atol=1e-5), h.batch_id
