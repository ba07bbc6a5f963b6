"""The shape of ``beamkit.ctc`` (read from the source, nothing imported): every module under 500 lines, one hash
formula and one probing rule for every hash table (``ctc/tables.py``), and no import circle between its modules
(function-level imports included: a lazy import still ties two modules together). Each detector is first shown
to find a planted case."""

from __future__ import annotations

import ast
from pathlib import Path

CTC = Path(__file__).resolve().parents[1] / "src" / "beamkit" / "ctc"
MAX_MODULE_LINES = 500
TABLES = "tables.py"
# 64-bit constants outside the tables module, each with why: the word hashes of the prefix store mix characters
# (content hashing, not a table's slots)
HASH_CONSTANTS_ALLOWED = {"prefix/nodes.py": "the multiplier of word_hash's mixing (MUL), not a table's slots"}


def ctc_modules(root: Path = CTC) -> dict[str, str]:
    """Path (relative to ``ctc/``) -> source of every module of ``beamkit.ctc``."""
    return {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8") for p in sorted(root.rglob("*.py"))}


# ---------------------------------------------------------------------------------------------------------------
# 1. no module over 500 lines


def long_modules(sources: dict[str, str], limit: int = MAX_MODULE_LINES) -> dict[str, int]:
    return {path: n for path, text in sources.items() if (n := len(text.splitlines())) > limit}


def test_the_length_detector_finds_a_planted_long_module():
    assert long_modules({"a.py": "x = 1\n" * 4, "b.py": "x = 1\n" * 3}, limit=3) == {"a.py": 4}


def test_no_ctc_module_over_500_lines():
    found = long_modules(ctc_modules())
    assert not found, f"split these modules (at most {MAX_MODULE_LINES} lines): {found}"


# ---------------------------------------------------------------------------------------------------------------
# 2. one hash formula, one probing rule


def probing_steps(tree: ast.Module) -> list[int]:
    """Lines computing a next slot by hand: ``(x + 1) & mask`` (linear probing written out)."""
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.BitAnd)
        and isinstance(node.left, ast.BinOp)
        and isinstance(node.left.op, ast.Add)
        and isinstance(node.left.right, ast.Constant)
        and node.left.right.value == 1
    )


def hash_constants(tree: ast.Module) -> list[int]:
    """Lines holding an integer constant of 40 bits or more (a multiplicative hash's multiplier)."""
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, int)
        and not isinstance(node.value, bool)
        and abs(node.value) >= 1 << 40
    )


def home_slots_by_hand(tree: ast.Module) -> list[int]:
    """Lines computing a slot by hand: something ``& mask`` that is not a call (a hash mixed in place)."""
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.BitAnd)
        and isinstance(node.right, ast.Name)
        and node.right.id == "mask"
    )


def test_the_hash_detectors_find_planted_formulas():
    planted = ast.parse(
        "def find(keys, key):\n"
        "    mask = len(keys) - 1\n"
        "    x = key * 0x5851F42D4C957F2D\n"
        "    s = (x ^ (x >> 29)) & mask\n"
        "    while keys[s] != key:\n"
        "        s = (s + 1) & mask\n"
        "    return s\n"
    )
    assert probing_steps(planted) == [6]
    assert hash_constants(planted) == [3]
    assert home_slots_by_hand(planted) == [4, 6]
    clean = ast.parse("def find(keys, key):\n    return probe(keys, key, -1)\n")
    assert probing_steps(clean) == hash_constants(clean) == home_slots_by_hand(clean) == []


def test_one_hash_formula_for_every_ctc_table():
    trees = {path: ast.parse(text) for path, text in ctc_modules().items() if path != TABLES}
    by_hand = {path: lines for path, tree in trees.items() if (lines := probing_steps(tree) + home_slots_by_hand(tree))}
    assert not by_hand, f"use beamkit.ctc.tables (home_slot, next_slot, probe) for these slots: {by_hand}"
    constants = {
        path: lines
        for path, tree in trees.items()
        if path not in HASH_CONSTANTS_ALLOWED and (lines := hash_constants(tree))
    }
    assert not constants, f"hash constants outside tables.py (one formula: tables.home_slot): {constants}"
    tables = ast.parse(ctc_modules()[TABLES])
    assert {n.name for n in tables.body if isinstance(n, ast.FunctionDef)} == {"home_slot", "next_slot", "probe"}


# ---------------------------------------------------------------------------------------------------------------
# 3. no import circle inside ctc/


def module_name(path: str) -> str:
    parts = ["beamkit", "ctc", *path.removesuffix(".py").split("/")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def ctc_imports(sources: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the modules of ``beamkit.ctc`` it imports anywhere (top level, functions, ``TYPE_CHECKING``
    blocks excepted: they never run), ``from . import x`` resolved to the module ``x`` when it is one."""
    names = {module_name(path) for path in sources}
    graph: dict[str, set[str]] = {}
    for path, text in sources.items():
        module = module_name(path)
        package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
        tree = ast.parse(text)
        skipped = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)
        }
        targets: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in names else base for a in node.names}
        graph[module] = {t for t in targets if t in names and t != module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that reach each other (a package's ``__init__`` re-exporting its own modules is not a
    circle: edges into a package from its own modules are left out)."""

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), set()) - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    edges = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}
    graph = edges
    reached = {m: reach(m) for m in graph}
    groups = {tuple(sorted({m} | {o for o in reached[m] if m in reached.get(o, set())})) for m in graph}
    return sorted(list(g) for g in groups if len(g) > 1)


def test_the_circle_detector_finds_a_planted_circle():
    sources = {
        "__init__.py": "from .a import f\n",
        "a.py": "def f():\n    from .b import g\n",
        "b.py": "from .a import f\n",
        "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\n",
        "d/__init__.py": "from .e import h\n",
        "d/e.py": "from ..a import f\n",
    }
    graph = ctc_imports(sources)
    assert graph["beamkit.ctc.c"] == set()
    assert circles(graph) == [["beamkit.ctc.a", "beamkit.ctc.b"]]


def test_no_import_circle_inside_ctc():
    found = circles(ctc_imports(ctc_modules()))
    assert not found, f"these modules of beamkit.ctc import each other (break the circle): {found}"
