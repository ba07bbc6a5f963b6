"""Every ```python block of the README runs as written, so the README cannot rot.

Blocks are found with a plain scan of the Markdown (a line that is exactly ```python opens one, the next line
that is exactly ``` closes it), so blocks added later are checked too. Each block runs in a FRESH namespace,
in a fresh temporary working folder (blocks may write files such as ``lm.arpa``): a reader can copy any one
block alone, so none may rely on another. A block that needs an optional package (torch, transformers) is
skipped when that package is missing, never silently passed: the skip names the block and the package.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
OPTIONAL = ("torch", "transformers", "safetensors", "kenlm", "matplotlib")


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(first line number, source)`` of each fenced ```python block, in order."""
    blocks: list[tuple[int, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i + 1
            end = start
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            if end == len(lines):
                raise AssertionError(f"README.md:{i + 1}: ```python block is never closed")
            blocks.append((start + 1, "\n".join(lines[start:end]) + "\n"))
            i = end
        i += 1
    return blocks


BLOCKS = python_blocks(README.read_text())


def test_the_scan_finds_the_blocks():
    text = "intro\n```python\nx = 1\n```\n```bash\nls\n```\n  ```python\ny = 2\n  ```\n"
    assert python_blocks(text) == [(3, "x = 1\n"), (9, "y = 2\n")]
    assert len(BLOCKS) >= 7  # the README's examples: seed 000, samplers, diverse, constrained, exact, hf, ctc


@pytest.mark.parametrize(("line", "source"), BLOCKS, ids=[f"README.md:{line}" for line, _ in BLOCKS])
def test_readme_python_block_runs(line, source, tmp_path, monkeypatch):
    imported = set(re.findall(r"^\s*(?:from|import)\s+(\w+)", source, flags=re.M))
    for name in sorted(imported & set(OPTIONAL)):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"README.md:{line} needs {name}")
    monkeypatch.chdir(tmp_path)
    code = compile(source, f"README.md:{line}", "exec")
    namespace: dict = {"__name__": "__readme__"}
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(code, namespace)
    assert "Traceback" not in out.getvalue()
