"""``daskrl ... --help``: every option of every command has help text, its default is shown
(and no "default: None" noise), and the exit statuses are listed; which error gives which
status (no Dask: the parser is built and rendered, never run)."""

from __future__ import annotations

import argparse
import re

import pytest

import daskrl.errors as errors
from daskrl.cli import main
from daskrl.cli._app import _parser
from daskrl.cli._exit import (
    CONFIG,
    EPILOG,
    INTERRUPTED,
    OK,
    RUNTIME,
    TERMINATED,
    USAGE,
    status_of,
)
from daskrl.cli._help import shows_default

NOISE = ("default: None", "default: False", "default: []", "default: {}", "default: ==SUPPRESS")


def _commands() -> dict[str, argparse.ArgumentParser]:
    root = _parser()
    [sub] = [a for a in root._actions if isinstance(a, argparse._SubParsersAction)]
    return {"daskrl": root, **{f"daskrl {name}": p for name, p in sub.choices.items()}}


def _help_by_option(text: str) -> dict[str, str]:
    """Each option's (and positional's) help text from a rendered ``--help``, whitespace
    collapsed, keyed by every option string of its line (``-h`` and ``--help``)."""
    out: dict[str, str] = {}
    keys: list[str] = []
    for line in text.splitlines():
        m = re.match(r"  (\S(?:\S| (?! ))*)(?: {2,}(.*))?$", line)
        if m and not line.startswith("   "):
            keys = [t.rstrip(",") for t in m.group(1).split() if t.startswith("-")] or [
                m.group(1)]
            for k in keys:
                out[k] = m.group(2) or ""
        elif keys and line.startswith("    ") and line.strip():
            for k in keys:
                out[k] = f"{out[k]} {line.strip()}".strip()
        else:
            keys = []
    return out


@pytest.mark.parametrize("command", list(_commands()))
def test_every_option_has_help_and_shows_its_default(command):
    parser = _commands()[command]
    text = parser.format_help()
    helps = _help_by_option(text)
    checked = 0
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:  # each command's line in the list
                assert choice.help, f"{command}: command {choice.dest} has no help"
            continue
        key = action.option_strings[0] if action.option_strings else action.dest
        assert action.help and action.help != argparse.SUPPRESS, f"{command} {key}: no help"
        shown = helps[key]
        assert shown, f"{command} {key}: empty help in\n{text}"
        if shows_default(action):
            assert "(default: " in shown, f"{command} {key}: default not shown: {shown!r}"
            if "%(default)" not in (action.help or "") and "default" not in action.help:
                assert f"(default: {action.default})" in shown, (key, shown)
        checked += 1
    assert checked >= (3 if command == "daskrl" else 4), command
    for noise in NOISE:
        assert noise not in text, f"{command}: {noise!r} in\n{text}"


def test_defaults_the_commands_state():
    collect = _help_by_option(_commands()["daskrl collect"].format_help())
    assert collect["--device"].endswith("(default: auto)")
    assert collect["--frames-per-batch"].endswith("(default: 4096)")
    assert collect["--env-kwargs"].endswith("(default: the env's own)")
    assert collect["--policy"].endswith("(default: an untrained 64-64 MLP)")
    gc = _help_by_option(_commands()["daskrl gc"].format_help())
    assert gc["--older-than"].endswith("(default: 3600.0)")


def test_every_help_ends_with_the_exit_statuses():
    rows = {int(m.group(1)) for m in re.finditer(r"^  (\d+) {2,}\S", EPILOG, re.M)}
    assert rows == {OK, RUNTIME, USAGE, CONFIG, INTERRUPTED, TERMINATED} == {0, 1, 2, 3, 130, 143}
    for command, parser in _commands().items():
        text = parser.format_help()
        assert "\nexit status:\n  0    success\n  1    runtime error: " in text, command
        assert re.search(r"\n  3    configuration error: .*\n {7}\S", text), command  # wraps


@pytest.mark.parametrize(("error", "status"), [
    (errors.ConfigError("x"), CONFIG),
    (errors.StoreURLError("x"), CONFIG),
    (errors.MissingDependencyError("x"), CONFIG),
    (errors.VersionMismatchError("x"), CONFIG),
    (errors.EnvError("x"), RUNTIME),
    (errors.PolicyError("x"), RUNTIME),
    (errors.BatchTimeoutError("x"), RUNTIME),
    (errors.StoreError("x"), RUNTIME),
    (errors.BatchDataMissingError("x"), RUNTIME),
    (errors.ClusterError("x"), RUNTIME),
    (errors.SlurmJobError("x"), RUNTIME),
    (errors.InternalError("x"), RUNTIME),
    (ValueError("x"), RUNTIME),  # not daskrl's: unexpected
    (KeyboardInterrupt(), INTERRUPTED),
])
def test_which_error_gives_which_status(error, status):
    assert status_of(error) == status


def test_a_command_line_that_does_not_parse_is_a_usage_error(capsys):
    for argv in (["collect", "--env", "CartPole-v1", "--store", "s", "--no-such-option"],
                 ["collect", "--store", "s"], ["collect", "--env", "E", "--store", "s",
                                               "--frames-per-batch", "many"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == USAGE, argv
    assert "the following arguments are required: --env" in capsys.readouterr().err


def test_the_docs_list_the_same_exit_statuses():
    from pathlib import Path

    page = Path(__file__).resolve().parents[2] / "docs" / "integrations" / "cli.md"
    rows = {int(m.group(1)) for m in re.finditer(r"^\| (\d+) \| ", page.read_text(), re.M)}
    assert rows == {OK, RUNTIME, USAGE, CONFIG, INTERRUPTED, TERMINATED}
