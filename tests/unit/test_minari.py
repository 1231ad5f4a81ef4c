"""The Minari export without Minari: the error names the extra to install."""

from __future__ import annotations

import sys

import pytest

import daskrl
from daskrl.integrations.minari import export_minari


@pytest.mark.parametrize("missing", ["minari", "h5py"])
def test_a_missing_minari_names_the_extra(missing, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, missing, None)  # `import missing` raises ImportError
    with pytest.raises(daskrl.MissingDependencyError,
                       match=r'needs minari and h5py .*pip install "daskrl\[minari\]"') as info:
        export_minari(tmp_path / "no-store", "x-v0")  # before the store is even opened
    assert isinstance(info.value, ImportError)


def test_a_bad_cut_is_refused_before_anything_is_read(tmp_path):
    with pytest.raises(daskrl.ConfigError, match="cut must be 'drop' or 'truncate', got 'keep'"):
        export_minari(tmp_path / "no-store", "x-v0", cut="keep")  # type: ignore[arg-type]
