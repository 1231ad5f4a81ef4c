"""The ``daskrl`` command with bad input (run in this process, ``tests/cli_inprocess.py``): one
line saying what to fix on stderr, the exit status of its class (2 usage, 3 configuration, 1
runtime), and a traceback only with ``--debug``. (The real command's exit statuses, as a
process: ``tests/test_cli_exit_status.py``.)"""

from __future__ import annotations

import json
import re
import subprocess
import uuid

import pytest
from cli_inprocess import daskrl_main

import daskrl
from daskrl.cli._exit import CONFIG, RUNTIME, USAGE

pytestmark = pytest.mark.timeout(300)


def _one_error_line(out: subprocess.CompletedProcess, status: int = CONFIG) -> str:
    """The error line, after checking it is all that was printed."""
    assert out.returncode == status, out
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("daskrl: error: "), out.stderr
    return lines[0].removeprefix("daskrl: error: ")


def _collect(tmp_path, *args: str) -> list[str]:
    return ["collect", "--store", str(tmp_path / "s"), "--frames", "64", "--frames-per-batch",
            "16", "--envs-per-worker", "2", "--workers", "1", "--no-progress", *args]


def test_a_misspelt_env_id(tmp_path):
    line = _one_error_line(daskrl_main(*_collect(tmp_path, "--env", "CartPol-v1")))
    assert line == ("could not make env 'CartPol-v1': Environment `CartPol` doesn't exist. Did "
                    "you mean: `CartPole`? Check the id (registered ids: "
                    "gymnasium.pprint_registry()) and import the package that registers it "
                    "('module:Id'), or name a callable making the env ('module:factory').")
    assert not (tmp_path / "s").exists()


def test_an_unknown_env_kwargs_key(tmp_path):
    line = _one_error_line(daskrl_main(*_collect(tmp_path, "--env", "CartPole-v1",
                                                 "--env-kwargs", '{"gravty": 9.8}')))
    assert line.startswith("could not make env 'CartPole-v1': TypeError: ")
    assert "unexpected keyword argument 'gravty'" in line
    assert line.endswith("Check env_kwargs ['gravty'] (--env-kwargs): the env's constructor "
                         "takes other arguments.")


def test_env_kwargs_that_are_not_a_json_object(tmp_path):
    out = daskrl_main(*_collect(tmp_path, "--env", "CartPole-v1", "--env-kwargs", "[9.8]"))
    assert out.returncode == USAGE and "Traceback" not in out.stderr  # argparse refused it
    assert out.stderr.splitlines()[-1] == ("daskrl collect: error: argument --env-kwargs: "
                                           "--env-kwargs takes a JSON object, got '[9.8]'")


@pytest.mark.parametrize(("factory", "message"), [
    ("daskrl.testing:TagPolicy", "--policy 'daskrl.testing:TagPolicy' cannot be called as "
     "factory(observation_space, action_space) (too many positional arguments): give it those "
     "two parameters, e.g. def make_policy(observation_space, action_space) -> "
     "torch.nn.Module."),
    ("daskrl.testing:worker_weights", "--policy 'daskrl.testing:worker_weights' raised when "
     "called with the env's spaces: AttributeError: "),
    ("json:dumps", "--policy 'json:dumps' cannot be called as factory(observation_space, "
     "action_space) (too many positional arguments)"),
    ("daskrl.policies:NoSuchPolicy", "--policy 'daskrl.policies:NoSuchPolicy': "
     "'daskrl.policies' has no attribute 'NoSuchPolicy'."),
])
def test_a_policy_factory_with_the_wrong_signature(cluster, tmp_path, factory, message):
    # Not about the cluster: the session's (the factory is refused before it is reached).
    line = _one_error_line(daskrl_main(*_collect(tmp_path, "--env", "CartPole-v1", "--policy",
                                                 factory, "--scheduler",
                                                 cluster.scheduler_address)))
    assert line.startswith(message), line


def test_storage_options_a_local_store_does_not_take(tmp_path):
    daskrl.TrajectoryStore(str(tmp_path / "s"), read_only=False).initialize()
    line = _one_error_line(daskrl_main("inspect", str(tmp_path / "s"), "--storage-options",
                                '{"anon": true}'))
    assert line == (f"store 'file://{tmp_path / 's'}' is a local path, which takes no "
                    "storage_options (they go to fsspec backends such as s3://), got ['anon']. "
                    "Drop them, or give the store's fsspec URL.")


def test_storage_options_an_s3_store_refuses_and_wrong_credentials(s3_with_auth):
    url = f"s3://daskrl-auth/{uuid.uuid4().hex}"
    options = {"endpoint_url": s3_with_auth, "key": "k", "secret": "s", "regoin": "x"}
    line = _one_error_line(daskrl_main("inspect", url, "--storage-options", json.dumps(options)))
    assert line.startswith(f"cannot read 'zarr.json' in store {url!r}: the fsspec backend "
                           "refused its storage_options (")
    assert "'regoin'" in line
    del options["regoin"]
    # Access denied is a runtime error: the same command may work once the credentials do.
    line = _one_error_line(daskrl_main("gc", url, "--storage-options", json.dumps(options)),
                           RUNTIME)
    # The server's own reason (e.g. "Forbidden", or that the key id is unknown) in between.
    head = f"cannot read 'zarr.json' in store {url!r}: access denied ("
    assert line.startswith(head) and line.endswith(
        "). Check the credentials in storage_options (key/secret, token, profile) or "
        "the environment, and that they may read and write this prefix."), line


def test_a_worker_error_is_one_line_with_worker_and_version(tmp_path):
    # CountingEnv(length="5") compares an int with a str in step(): on the worker only. On the
    # embedded cluster (TLS: its tls:// worker address in the message).
    out = daskrl_main(*_collect(tmp_path, "--env", "daskrl.testing:Counting-v0",
                                "--env-kwargs", '{"length": "5"}'))
    line = _one_error_line(out, RUNTIME)
    assert re.fullmatch(
        re.escape("env 'daskrl.testing:Counting-v0' (env index 0) raised in step() at step 0 "
                  "of batch 0: TypeError(\"'>=' not supported between instances of 'int' and "
                  "'str'\")") + r" \[worker tls://127\.0\.0\.1:\d+, weights version 0\]" +
        re.escape(" (--debug shows the full error)"), line), line


def test_debug_prints_the_traceback(tmp_path):
    for args in (["--debug", *_collect(tmp_path, "--env", "CartPol-v1")],
                 [*_collect(tmp_path, "--env", "CartPol-v1"), "--debug"]):
        out = daskrl_main(*args)
        assert out.returncode == CONFIG
        assert out.stderr.startswith("Traceback (most recent call last):")
        assert "gymnasium.error.NameNotFound" in out.stderr  # the cause, chained
        assert out.stderr.splitlines()[-1].startswith(
            "daskrl: error: could not make env 'CartPol-v1'")
