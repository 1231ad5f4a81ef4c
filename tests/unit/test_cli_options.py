"""The ``collect`` command's collection flags are generated from ``CollectorConfig``: one per
field, with the field's default and help, and parsing gives the config back (no Dask)."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from daskrl.cli import main
from daskrl.cli._options import ALIASES, add_config_options, config_from_args, config_options
from daskrl.config import CollectorConfig, Compression
from daskrl.errors import ConfigError

FLAGS_BEFORE = {  # the flags the hand-written parser had, which docs and scripts use
    "--frames", "--frames-per-batch", "--envs-per-worker", "--workers", "--max-frames-per-traj",
    "--init-random-frames", "--reset-at-each-iter", "--async", "--seed", "--compression",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="test", exit_on_error=False)
    add_config_options(p)
    return p


def test_every_field_has_a_flag_with_its_default_and_help():
    options = {o.field: o for o in config_options()}
    fields = [f for f in dataclasses.fields(CollectorConfig) if f.metadata.get("flag") != "by hand"]
    # fields whose flags the collect command writes itself (their own parsing)
    assert {f.name for f in dataclasses.fields(CollectorConfig)} - {f.name for f in fields} == {
        "device", "env_kwargs", "env_vars", "shared_memory", "wrappers", "vector_kwargs"}
    assert list(options) == [f.name for f in fields]
    parsed = vars(_parser().parse_args([]))
    for f in fields:
        kwargs = options[f.name].kwargs
        default = f.default.value if isinstance(f.default, Compression) else f.default
        assert kwargs["default"] == parsed[f.name] == default, f.name
        assert f.metadata["help"].replace("%", "%%") in kwargs["help"], f.name
        if not isinstance(f.default, bool) and "(default: " not in f.metadata["help"]:
            shown = "none" if default in (None, ()) else default  # () as info_keys has it
            assert kwargs["help"].endswith(f"(default: {shown})"), kwargs["help"]
    assert options["compression"].kwargs["choices"] == [c.value for c in Compression]
    flags = {o.flag for o in options.values()} | {a for f in ALIASES.values() for a in f}
    assert flags >= FLAGS_BEFORE


def test_no_flags_give_the_default_config():
    assert config_from_args(_parser().parse_args([])) == CollectorConfig()


def test_flags_set_their_fields():
    args = _parser().parse_args([
        "--frames", "none", "--frames-per-batch", "64", "--envs-per-worker", "4", "--workers",
        "3", "--async", "--reset-at-each-iter", "--compression", "lz4", "--batch-timeout",
        "2.5", "--on-env-error", "restart", "--max-policy-lag", "0", "--seed", "7",
    ])
    assert config_from_args(args) == CollectorConfig(
        total_frames=None, frames_per_batch=64, envs_per_worker=4, num_workers=3, rounds=False,
        reset_at_each_iter=True, compression=Compression.LZ4, batch_timeout=2.5,
        on_env_error="restart", max_policy_lag=0, seed=7)


@pytest.mark.parametrize("flag", ["--no-rounds", "--async"])
def test_no_rounds_and_its_older_flag_collect_first_done(flag):
    assert config_from_args(_parser().parse_args([])).rounds is True
    assert config_from_args(_parser().parse_args([flag])).rounds is False


def test_a_bad_value_is_the_configs_error():
    with pytest.raises(ConfigError, match="total_frames=1001 is not a multiple of "
                                          "envs_per_worker=8"):
        config_from_args(_parser().parse_args(["--frames", "1001"]))
    with pytest.raises(argparse.ArgumentError, match="invalid choice: 'brotli'"):
        _parser().parse_args(["--compression", "brotli"])


def test_the_collect_command_has_every_generated_flag(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["collect", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for option in config_options():
        assert f" {option.flag}" in text, option.flag
    assert "--device" in text and "--policy" in text and "--scheduler" in text
