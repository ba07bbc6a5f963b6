"""``make demo`` installs only the runtime extra it needs; ``make test`` still installs every dev tool.

Checked with ``make -n`` (print the commands, run nothing) on a copy of the Makefile in an empty folder, as a
fresh clone would see it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def planned(target: str, tmp_path: Path) -> list[str]:
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    # as a fresh top-level make: run under `make test`, an inherited MAKELEVEL / MAKEFLAGS would add
    # "make[1]: Entering directory" lines and flags of the outer make
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES")}
    done = subprocess.run(["make", "-n", target], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_demo_installs_only_the_models_extra(tmp_path):
    lines = planned("demo", tmp_path)
    installs = [line for line in lines if "pip install" in line and "-e" in line]
    assert installs == [line for line in installs if '".[models]"' in line] and len(installs) == 1, installs
    assert not any("[dev]" in line for line in installs)
    assert any(line.startswith("echo ") for line in lines)  # it says what it installs instead of a silent wait
    assert lines[-1].endswith('beamkit translate --beam 5 "3rd of March 1999"')


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_test_still_installs_the_dev_tools(tmp_path):
    lines = planned("test", tmp_path)
    assert any('pip install -q -e ".[dev]"' in line for line in lines)
    assert any("pytest tests" in line for line in lines)
