"""``make test-fast`` ends with pytest's pass/fail line ("N passed in S s", or the failures and "N failed").

Checked by running the pytest command the Makefile plans (``make -n test-fast`` on a copy of the Makefile) from
the project root, where pyproject's pytest options apply, on two small test files of its own (one passing, one
failing): the oracle is pytest's own summary line, which a doubled ``-q`` suppresses.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def planned_pytest(tmp_path: Path) -> list[str]:
    """The argv of the pytest run ``make test-fast`` plans, its test files left out."""
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES")}
    done = subprocess.run(
        ["make", "-n", "test-fast"], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if "-m pytest" in x)
    argv = shlex.split(line)
    return [a for a in argv[argv.index("pytest") + 1 :] if not a.startswith("tests/")]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_test_fast_prints_the_pass_fail_line(tmp_path):
    options = planned_pytest(tmp_path)
    cases = tmp_path / "cases"
    cases.mkdir()
    (cases / "test_ok.py").write_text("def test_a():\n    assert True\n\ndef test_b():\n    assert 1 + 1 == 2\n")
    (cases / "test_bad.py").write_text("def test_c():\n    assert 1 + 1 == 3\n")
    for files, needle, code in (([cases / "test_ok.py"], "2 passed", 0), ([*cases.iterdir()], "1 failed, 2 passed", 1)):
        done = subprocess.run(
            [sys.executable, "-m", "pytest", *options, "-p", "no:cacheprovider", *map(str, sorted(files))],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        last = done.stdout.strip().splitlines()[-1]
        assert done.returncode == code and needle in last, done.stdout
