"""``bench/vs_vllm.py`` without a vLLM install: one error line and exit status 2 (vLLM is no test dependency)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "vs_vllm.py"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        ([], "--vllm-python"),
        (["--vllm-python", str(ROOT / "no-such-python")], "cannot run --vllm-python"),
        (["--vllm-python", sys.executable], "cannot import vllm"),
    ],
)
def test_without_vllm_it_says_so_in_one_line_and_exits_2(argv, needle):
    if argv and argv[-1] == sys.executable and importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is importable here")
    got = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=300)
    lines = got.stderr.strip().splitlines()
    assert got.returncode == 2 and got.stdout == ""
    assert len(lines) == 1 and lines[0].startswith("vs_vllm: error:") and needle in lines[0]
