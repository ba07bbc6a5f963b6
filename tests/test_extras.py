"""Install hints are honest: every extra an error names exists in pyproject.toml, no text tells users to install
beamkit from a package index (it is not on one), and the extras' table (getting started; the README's line)
is pyproject's list."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from beamkit.extras import install_hint

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
SOURCES = sorted((ROOT / "src" / "beamkit").rglob("*.py"))
INDEX_INSTALL = re.compile(r"""pip install ['"]?beamkit\[""")


def test_the_hint_is_the_checkout_install():
    assert install_hint("hf") == 'pip install ".[hf]" from a beamkit checkout'


def test_every_hinted_extra_exists():
    named = {
        (path.name, m.group(1))
        for path in SOURCES
        for m in re.finditer(r"""install_hint\(['"]([^'"]+)['"]\)""", path.read_text())
    }
    assert len(named) >= 7  # the optional features' import errors
    assert {extra for _, extra in named} <= EXTRAS, sorted(named)


def test_nothing_claims_an_index_install():
    assert INDEX_INSTALL.search("""pip install 'beamkit[hf]'""")  # the pattern catches both quotings
    assert INDEX_INSTALL.search('pip install "beamkit[ocr]"') and not INDEX_INSTALL.search('pip install ".[ocr]"')
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    offenders = [str(p.relative_to(ROOT)) for p in [*SOURCES, *pages] if INDEX_INSTALL.search(p.read_text())]
    assert offenders == []


def test_the_install_pages_list_every_extra():
    """The getting-started page's table of extras is pyproject's list, and the README's line of extras names each."""
    rows = re.findall(r"^\| `([a-z0-9-]+)` \|", (ROOT / "docs" / "getting-started.md").read_text(), flags=re.M)
    assert set(rows) == EXTRAS
    line = next(s for s in (ROOT / "README.md").read_text().split("\n\n") if s.startswith("Extras:"))
    assert set(re.findall(r"`([a-z0-9-]+)`", line)) == EXTRAS
