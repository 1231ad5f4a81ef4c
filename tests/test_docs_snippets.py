"""Every Python example in docs/ runs.

The rule: in ``docs/**/*.md``, each ```` ```python ```` block at the start of a line is run.
A page's blocks run in order, as one script, in a fresh directory (as a reader following the
page would run them). A block that cannot run here (it needs SLURM, Kubernetes, a remote
scheduler) says so in its fence: ```` ```python title="... (not run)" ````; it is shown on the
page and not run. Any other fence attribute is an error, so no block is skipped by accident.
``docs/store-format.md``'s reader is run against a real store by
``tests/test_cli_and_docs.py``, and is left out here.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
COVERED_ELSEWHERE = {"store-format.md"}
FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.M | re.S)
NOT_RUN = re.compile(r'^ title="[^"]*\(not run\b[^"]*"$')


def _pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if p.name not in COVERED_ELSEWHERE)


def _runnable(page: Path) -> list[str]:
    blocks = []
    for info, code in FENCE.findall(page.read_text()):
        if info == "":
            blocks.append(code)
        elif not NOT_RUN.match(info):
            raise AssertionError(
                f"{page}: a python block's fence has {info!r}; use ```python (run in CI) or "
                '```python title="... (not run)"'
            )
    return blocks


def test_every_python_block_follows_the_rule():
    pages = _pages()
    assert len(pages) >= 10
    for page in pages:
        text = page.read_text()
        _runnable(page)  # raises on an unknown fence attribute
        # An indented fence (in a list) would escape the extractor above.
        assert not re.search(r"^[ \t]+```python", text, re.M), page
    assert sum(len(_runnable(p)) for p in pages) >= 7


@pytest.mark.parametrize(
    "page", [p for p in _pages() if _runnable(p)], ids=lambda p: str(p.relative_to(DOCS))
)
def test_page_python_blocks_run(page, tmp_path):
    script = tmp_path / "page.py"
    script.write_text("\n\n".join(_runnable(page)))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=280, cwd=tmp_path)
    assert out.returncode == 0, f"{page}:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
