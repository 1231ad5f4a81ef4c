"""Plain ids in a namespace that a package registers on import (``ALE/Pong-v5``: ``ale_py``)
make their env with nothing imported by the user; a missing package is a clear EnvError."""

from __future__ import annotations

import gymnasium as gym
import pytest

from daskrl import EnvError
from daskrl.worker import _env_import
from daskrl.worker._env_import import NAMESPACE_PACKAGES, import_env_factory
from daskrl.worker._envs import EnvSpec


def test_an_ale_id_imports_ale_py_and_is_made_with_gymnasium():
    assert NAMESPACE_PACKAGES["ALE"][0] == "ale_py"
    assert import_env_factory("ALE/Pong-v5") is None  # a gymnasium id, not a factory
    assert "ALE/Pong-v5" in gym.registry
    env = EnvSpec("ALE/Pong-v5", env_kwargs={"frameskip": 1}).make()
    try:
        assert env.observation_space.shape == (210, 160, 3)
        assert env.unwrapped.spec.id == "ALE/Pong-v5"
    finally:
        env.close()


def test_a_missing_namespace_package_names_the_id_and_how_to_install(monkeypatch):
    monkeypatch.setitem(_env_import.NAMESPACE_PACKAGES, "NoSuchGames",
                        ("daskrl_no_such_games", 'pip install "daskrl-no-such-games"'))
    with pytest.raises(EnvError) as info:
        EnvSpec("NoSuchGames/Pong-v0").make()
    msg = str(info.value)
    assert "'NoSuchGames/Pong-v0'" in msg and "'daskrl_no_such_games'" in msg
    assert 'pip install "daskrl-no-such-games"' in msg


def test_ids_of_other_namespaces_import_nothing(monkeypatch):
    monkeypatch.setitem(_env_import.NAMESPACE_PACKAGES, "NoSuchGames",
                        ("daskrl_no_such_games", "-"))
    # Not in the table: gymnasium's own error for an unknown namespace, as before.
    with pytest.raises(EnvError, match="Namespace Other not found"):
        EnvSpec("Other/Pong-v0").make()
    assert import_env_factory("CartPole-v1") is None
