"""``make demo`` installs beamkit alone (numpy); ``make test`` still installs every dev tool.

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
def test_make_demo_installs_beamkit_alone(tmp_path):
    lines = planned("demo", tmp_path)
    installs = [line for line in lines if "pip install" in line and "-e" in line]
    assert [line.split()[-1] for line in installs] == ["."], installs  # no extras: numpy is all the demo needs
    assert any(line.startswith("echo ") for line in lines)  # it says what it installs instead of a silent wait
    assert lines[-1].endswith('beamkit translate --beam 5 "3rd of March 1999"')


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_test_still_installs_the_dev_tools(tmp_path):
    lines = planned("test", tmp_path)
    assert any('pip install -q -e ".[dev]"' in line for line in lines)
    assert any("pytest tests" in line for line in lines)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_numerics_reruns_on_other_threads_without_vector_instructions(tmp_path):
    line = planned("numerics", tmp_path)[-1]
    for setting in (
        "BEAMKIT_TEST_TORCH_THREADS=3",
        "OMP_NUM_THREADS=1",
        "MKL_NUM_THREADS=1",
        "OPENBLAS_NUM_THREADS=1",
        "ATEN_CPU_CAPABILITY=default",
        "ONEDNN_MAX_CPU_ISA=SSE41",
        "MKL_ENABLE_INSTRUCTIONS=SSE4_2",
        "NPY_DISABLE_CPU_FEATURES=",
    ):
        assert setting in line, (setting, line)
    assert "-m pytest" in line


def test_ci_runs_the_tests_then_the_numerics_then_the_wheel():
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert lines.index("make test") < lines.index("make numerics") < lines.index("make wheel-check")


def test_the_pinned_thread_count_is_one_unless_told(monkeypatch):
    from tests.conftest import THREADS_VAR, pinned_threads

    monkeypatch.delenv(THREADS_VAR, raising=False)
    assert pinned_threads() == 1
    monkeypatch.setenv(THREADS_VAR, "3")
    assert pinned_threads() == 3
    for bad in ("0", "-1", "two", ""):
        monkeypatch.setenv(THREADS_VAR, bad)
        with pytest.raises(ValueError, match=THREADS_VAR):
            pinned_threads()


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_test_runs_the_hf_tests_again_on_the_newest_transformers_after_the_peers(tmp_path):
    lines = planned("test", tmp_path)
    peer = lines.index(".venv-peer/bin/python -m pytest tests/peer")
    newest = lines.index(".venv-hf/bin/python -m pytest tests/test_hf*.py -q")  # every test_hf module, by glob
    assert peer < newest
    installs = [line for line in lines if line.startswith(".venv-hf/bin/pip install")]
    assert any("transformers==" in line and "torch==" in line for line in installs), installs
    assert installs[-1].endswith("pip install -q -e . --no-deps")  # beamkit from this tree, nothing else


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_test_fast_installs_no_extra_and_runs_tests_that_exist(tmp_path):
    lines = planned("test-fast", tmp_path)
    installs = [line for line in lines if "pip install" in line and "-e" in line]
    assert installs and all("[" not in line for line in installs), installs  # no extras: no torch to download
    run = lines[-1]
    assert "-m pytest" in run and '-m "not slow"' in run
    files = [word for word in run.split() if word.startswith("tests/")]
    assert len(files) >= 10 and all((ROOT / f).is_file() for f in files), files
    assert "tests/test_cli_hostile.py" in files and "tests/test_search.py" in files  # the command line, the core
