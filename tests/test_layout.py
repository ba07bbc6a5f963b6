"""The layout rules, read from the source with ``ast``: argument checks go through ``beamkit._checks``, torch code
stays in its homes, and no public class or function is defined in two modules.

Each rule's detector is also run on a planted snippet, so a detector that finds nothing cannot pass for a clean
tree. The few checks kept inline on purpose are counted per file (a new one fails the test).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "beamkit"


def modules() -> dict[str, ast.Module]:
    """Every module of src/beamkit, parsed, by its path relative to src/beamkit (``cli/entry.py``)."""
    return {p.relative_to(SRC).as_posix(): ast.parse(p.read_text(encoding="utf-8")) for p in sorted(SRC.rglob("*.py"))}


# ---------------------------------------------------------------------------------------------------------------
# 1. inline argument checks

NUMBER_TYPES = {"int", "float", "bool", "complex", "integer", "floating", "number", "bool_", "Integral", "Real"}
ARRAY_METADATA = {"ndim", "shape", "size", "dtype"}  # shape checks of arrays, not argument values
FINITE_TESTS = {"isfinite", "isnan", "isinf"}


def _plain(node: ast.expr) -> bool:
    """A name, an attribute chain on a name or a constant subscript of one (``x``, ``self.k``, ``beams[0]``) that
    is not array metadata (``.ndim``, ``.shape[...]``, ``.size``, ``.dtype``)."""
    if isinstance(node, ast.Name):
        return True
    if isinstance(node, ast.Attribute):
        return node.attr not in ARRAY_METADATA and _plain(node.value)
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and _plain(node.value)
    return False


def _number(node: ast.expr) -> bool:
    """A literal number, not a bool: ``1``, ``-1``, ``0.5``, arithmetic of literals (``2**31 - 1``) or
    ``float("inf")``."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _number(node.operand)
    if isinstance(node, ast.BinOp):
        return _number(node.left) and _number(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "float":
        return len(node.args) == 1 and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
    return isinstance(node, ast.Constant) and type(node.value) in (int, float)


def _type_names(node: ast.expr) -> list[str]:
    """The last names of the types of an isinstance's second argument (``(int, np.integer)`` -> int, integer)."""
    items = node.elts if isinstance(node, ast.Tuple) else [node]
    return [i.attr if isinstance(i, ast.Attribute) else i.id if isinstance(i, ast.Name) else "?" for i in items]


def _check(node: ast.expr) -> bool:
    """One of the checks ``_checks`` makes: a plain value against a literal number, in a tuple of literals, an
    isinstance against number types, or a finiteness test of a plain value."""
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        if any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            options = node.comparators[-1]
            return (
                _plain(node.left)
                and isinstance(options, (ast.Tuple, ast.List, ast.Set))
                and all(isinstance(e, ast.Constant) for e in options.elts)
            )
        return any(_number(o) for o in operands) and all(_number(o) or _plain(o) for o in operands)
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name == "isinstance" and len(node.args) == 2:
            return _plain(node.args[0]) and set(_type_names(node.args[1])) <= NUMBER_TYPES
        return name in FINITE_TESTS and len(node.args) == 1 and _plain(node.args[0])
    return False


def _allowed(node: ast.expr) -> bool:
    """A part of a check's condition: a check, a None test, a plain value's truth, or these joined by
    not / and / or."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return _allowed(node.operand)
    if isinstance(node, ast.BoolOp):
        return all(_allowed(v) for v in node.values)
    if isinstance(node, ast.Compare) and all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
        return all(
            _plain(o) or (isinstance(o, ast.Constant) and o.value is None) for o in [node.left, *node.comparators]
        )
    return _check(node) or _plain(node)


def _has_check(node: ast.expr) -> bool:
    """Whether a condition holds at least one check (not only None tests and truth values)."""
    return _check(node) or any(_check(n) for n in ast.walk(node) if isinstance(n, (ast.Compare, ast.Call)))


def _says_must(call: ast.Call) -> bool:
    """Whether the exception's message (its string parts) says "must"."""
    return any(isinstance(n, ast.Constant) and isinstance(n.value, str) and "must" in n.value for n in ast.walk(call))


def inline_checks(tree: ast.Module) -> list[int]:
    """Line numbers of the inline argument checks in a module.

    An inline check is an ``if`` without ``else`` whose body is a single ``raise ValueError(...)`` or ``raise
    TypeError(...)`` whose message says "must", and whose condition is built with not / and / or from checks
    (and optionally ``x is None`` / ``x is not None`` guards and truth values of plain values), at least one
    of them a check. A check is one of:

    * a comparison of a plain value (a name, ``obj.attr``, ``obj[0]``; array metadata ``.ndim``, ``.shape``,
      ``.size``, ``.dtype`` excluded) with a literal number: ``k < 1``, ``not 0 < p <= 1``,
      ``not 1 <= n <= beam``;
    * a plain value ``in`` / ``not in`` a tuple of literals: ``policy not in ("narrow", "pool")``;
    * ``isinstance(x, T)`` where T names only number types (int, float, bool, numpy's integer / floating ...);
    * ``math.isfinite(x)`` / ``isnan`` / ``isinf`` of a plain value.

    These are what ``check_int``, ``check_float``, ``check_bool``, ``check_choice`` and their friends do. A
    condition that computes something (``n % groups``, ``len(x) != len(y)``, ``all(...)``) or compares two
    values with each other only is logic, not an argument check, and is not matched.
    """
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.If) and not node.orelse and len(node.body) == 1):
            continue
        stmt = node.body[0]
        if not (isinstance(stmt, ast.Raise) and isinstance(stmt.exc, ast.Call)):
            continue
        exc = stmt.exc.func
        if not (isinstance(exc, ast.Name) and exc.id in ("ValueError", "TypeError") and _says_must(stmt.exc)):
            continue
        if _allowed(node.test) and _has_check(node.test):
            found.append(node.lineno)
    return found


PLANTED_CHECKS = """
def f(beam, p, mode, seed, kv, a, b, groups, n, arr, count):
    if beam < 1:
        raise ValueError(f"beam must be >= 1, got {beam}")
    if not 0 < p <= 1:
        raise ValueError("p must be in (0, 1]")
    if mode not in ("narrow", "pool"):
        raise ValueError("mode must be narrow or pool")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
        raise TypeError("seed must be an int")
    if not (p > 0 and math.isfinite(p)):
        raise ValueError("p must be > 0 and finite")
    if self.opts.k < 1:
        raise ValueError("k must be >= 1")
    if not 0 <= p < float("inf") or not 1 <= beam < 2**31:
        raise ValueError("p must be finite")
    # not checks: logic, another exception, no "must", an else branch, array shapes, non-number types
    if groups > 1 and n % groups:
        raise ValueError("beam size must be a multiple of the groups")
    if a < b:
        raise ValueError("a must not be below b")
    if len(a) < 1:
        raise ValueError("a must not be empty")
    if beam < 1:
        raise RuntimeError("beam must be >= 1")
    if beam < 1:
        raise ValueError("beam too small")
    if beam < 1:
        raise ValueError("beam must be >= 1")
    else:
        count += 1
    if arr.ndim != 2:
        raise ValueError("arr must be 2-D")
    if not isinstance(kv, dict):
        raise TypeError("kv must be a dict")
"""


def test_the_inline_check_detector_finds_planted_checks_and_nothing_else():
    tree = ast.parse(PLANTED_CHECKS)
    assert inline_checks(tree) == [3, 5, 7, 9, 11, 13, 15]


# The search core's option checks, kept inline on purpose: their exact messages and exception types (a
# ValueError for ``beam_size=True`` or ``min_len=1.5``, "between 1 and beam_size=2") are part of the contract
# pinned by tests/test_engine_rules.py, tests/test_search.py and tests/test_contract.py and killed mutants in
# bench/mutation.py; ``_checks`` would raise TypeError for a wrong kind and word the ranges differently. The
# number is how many such checks each file holds; a new one fails the test.
CONTRACT_CHECKS = {
    "search/options.py": 5,  # beam_size / max_len, patience, num_return, min_len, beam_threshold
    "search/engine.py": 1,  # the number of requests of Engine.add
    # pyctcdecode's own reset_params checks, word for word ("alpha must be a float. Got <class 'int'>."), as the
    # drop-in must raise them
    "ctc/compat/language_model.py": 2,
}


def test_no_inline_argument_checks_outside_checks_module():
    found = {
        path: lines
        for path, tree in modules().items()
        if path != "_checks.py" and len(lines := inline_checks(tree)) > CONTRACT_CHECKS.get(path, 0)
    }
    assert not found, f"use beamkit._checks instead of these inline checks (file: lines): {found}"


def test_contract_checks_are_counted_exactly():
    trees = modules()
    assert {p: len(inline_checks(trees[p])) for p in CONTRACT_CHECKS} == CONTRACT_CHECKS


# ---------------------------------------------------------------------------------------------------------------
# 2. torch code in its homes

# modules (or rooms) that are torch by nature; compat/ is OLMo's torch API, ctc/compat/torchaudio.py torchaudio's
TORCH_HOMES = ("ops/", "hf/", "kv/", "models/", "compat/", "ctc/compat/torchaudio.py", "openvino/")


def torch_branches(tree: ast.Module) -> list[int]:
    """Line numbers of torch code in a module: an ``import torch`` / ``import torch.x`` / ``from torch...``
    anywhere (a lazy import inside a function too), or a call of ``is_torch`` (``ops.is_torch(x)``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "torch" for a in node.names):
            found.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch" and not node.level:
            found.append(node.lineno)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name == "is_torch":
                found.append(node.lineno)
    return sorted(found)


PLANTED_TORCH = """
import torchaudio
from torchvision import io
def f(x):
    import torch.nn
    if ops.is_torch(x):
        from torch import nn
    return is_torch(x), "import torch"
"""


def test_the_torch_detector_finds_planted_branches():
    assert torch_branches(ast.parse(PLANTED_TORCH)) == [5, 6, 7, 8]


def _home(path: str) -> bool:
    return any(path == h or (h.endswith("/") and path.startswith(h)) for h in TORCH_HOMES)


def test_torch_code_only_in_ops_and_the_torch_rooms():
    found = {path: lines for path, tree in modules().items() if not _home(path) and (lines := torch_branches(tree))}
    assert not found, f"move these torch branches into beamkit.ops helpers (file: lines): {found}"


# ---------------------------------------------------------------------------------------------------------------
# 3. one public definition per name

# The command modules' protocol: every cli/<command>.py defines register(sub) and run(args) by design.
PROTOCOL_NAMES = {"register", "run"}
# A drop-in keeps the names of the library it replaces (beamkit.compat.olmo.BeamSearch is OLMo's BeamSearch,
# beamkit.ctc.compat.torchaudio.CTCHypothesis torchaudio's): its names are unique among themselves, not against
# beamkit's own. beamkit.openvino.generate is beamkit.hf.generate over an OpenVINO IR: the same name by design.
DROP_INS = ("compat/", "ctc/compat/torchaudio.py", "openvino/generation.py")


def public_definitions(tree: ast.Module) -> set[str]:
    """Public (no leading underscore) names a module defines at its top level: classes, functions, and names
    starting with a capital letter that it assigns (constants such as ``TABLE = ...``, type aliases such as
    ``Policy = Literal[...]``). Names brought in by ``import`` are not definitions; nor are lower-case variables
    (``logger = logging.getLogger(__name__)``)."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name) and t.id[:1].isupper())
    return {n for n in names if not n.startswith("_")}


def defined_twice(trees: dict[str, ast.Module]) -> dict[str, list[str]]:
    """Each public name defined in more than one module, with those modules (``cli/`` protocol names exempt)."""
    where: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path, tree in trees.items():
        for name in public_definitions(tree):
            if not (path.startswith("cli/") and name in PROTOCOL_NAMES):
                room = next((d for d in DROP_INS if path.startswith(d)), "")
                where[(room, name)].append(path)
    return {name: paths for (_, name), paths in where.items() if len(paths) > 1}


def test_the_twice_detector_finds_a_planted_pair():
    trees = {
        "a.py": ast.parse("class Policy: pass\nTABLE = 1\ndef _helper(): pass\nfrom b import render\nlog = 1"),
        "b.py": ast.parse("Policy = Literal['a']\ndef render(): pass\ndef _helper(): pass\nTABLE = 2\nlog = 2"),
        "cli/x.py": ast.parse("def run(args): pass\ndef register(sub): pass"),
        "cli/y.py": ast.parse("def run(args): pass\ndef register(sub): pass"),
        "compat/olmo/search.py": ast.parse("class Policy: pass\nclass Sampler: pass"),
        "compat/olmo/samplers.py": ast.parse("class Sampler: pass"),
    }
    found = {
        "Policy": ["a.py", "b.py"],
        "TABLE": ["a.py", "b.py"],
        "Sampler": ["compat/olmo/search.py", "compat/olmo/samplers.py"],
    }
    assert defined_twice(trees) == found


def test_no_public_name_defined_in_two_modules():
    twice = defined_twice(modules())
    assert not twice, f"define each public name in one module and import it elsewhere: {twice}"


# ---------------------------------------------------------------------------------------------------------------
# 4. one import path per name: no module-level __getattr__ (no forwarding tables of old names)

# A module-level ``__getattr__`` is allowed only as a documented lazy import (an optional extra imported on first
# use), named here as "path: why". None is needed today: every package imports its names directly.
LAZY_GETATTR: dict[str, str] = {}


def module_getattr(tree: ast.Module) -> list[int]:
    """Line numbers where a module binds ``__getattr__`` at its top level (a ``def`` or an assignment, also inside a
    top-level ``if`` / ``try``)."""
    found = []
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "__getattr__":
            found.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__getattr__" for t in targets):
                found.append(node.lineno)
        elif isinstance(node, ast.If):
            stack += node.body + node.orelse
        elif isinstance(node, ast.Try):
            stack += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
    return sorted(found)


def test_the_getattr_detector_finds_planted_ones():
    planted = (
        '"""doc"""\nfrom x import forward\n__getattr__ = forward(__name__, {})\n'
        "def __getattr__(name): pass\n"
        "class A:\n    def __getattr__(self, name): pass\n"
        "def f():\n    def __getattr__(name): pass\n"
        "try:\n    pass\nexcept ImportError:\n    def __getattr__(name): pass\n"
    )
    assert module_getattr(ast.parse(planted)) == [3, 4, 12]


def test_no_module_getattr_but_documented_lazy_imports():
    found = {
        path: lines for path, tree in modules().items() if path not in LAZY_GETATTR and (lines := module_getattr(tree))
    }
    assert not found, f"import these names from their one module instead of forwarding them (file: lines): {found}"
    stale = [path for path in LAZY_GETATTR if not module_getattr(modules()[path])]
    assert not stale, f"these allowed lazy imports are gone: drop them from LAZY_GETATTR: {stale}"


@pytest.mark.parametrize(
    "old",
    [
        "beamkit.tasks.train:train",
        "beamkit.models.training:train",
        "beamkit.models:Translation",
        "beamkit.adapters:Output",
        "beamkit.corpus:Scored",
        "beamkit.samplers:stochastic_beam_search",
        "beamkit.samplers:GumbelTopK",
        "beamkit.samplers:as_float64",
        "beamkit.samplers:gather_cols",
        "beamkit.tasks.dates:render",
        "beamkit.tasks.g2p:split",
        "beamkit.tasks.g2p:lm_corpus",
        "beamkit.demo:TABLE",
        "beamkit.models.checkpoint:FORMAT",
        "beamkit.models.checkpoint:BACKENDS",
        "beamkit.search.options:Policy",
        "beamkit.models.checkpoint:load",
        "beamkit.corpus.decoder:Decoder",
        "beamkit.corpus:Decoder",
        "beamkit.serve.runner:Progress",
        "beamkit.serve:load_adapter",
        "beamkit.serve:HFAdapter",
        "beamkit.models:translate",
    ],
)
def test_old_names_are_gone(old):
    import importlib

    module, name = old.split(":")
    with pytest.raises(AttributeError, match=f"^module '{module}' has no attribute '{name}'$"):
        getattr(importlib.import_module(module), name)


@pytest.mark.parametrize(
    "old",
    [
        "beamkit.moved",
        "beamkit.engine",
        "beamkit.ngram",
        "beamkit.ctc.kneser_ney",
        "beamkit.ctc.cli",
        "beamkit.corpus.cli",
        "beamkit.serve.cli",
        "beamkit.tasks.cli",
        "beamkit.serve.adapters",
        "beamkit.ctc.compat.legacy",
        "beamkit.models.translation",
        "beamkit.hf.generation",
        "beamkit.hf.step",
        "beamkit.hf.paged",
        "beamkit.hf.allowed",
    ],
)
def test_old_modules_are_gone(old):
    import importlib

    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


# ---------------------------------------------------------------------------------------------------------------
# 5. no import cycle between packages


def room(module: str) -> str:
    """The package a module belongs to: the first name under ``beamkit`` (``beamkit.cli.tasks`` -> ``cli``,
    ``beamkit.ops`` -> ``ops``); ``beamkit`` itself for the top package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "beamkit"


def _module_name(path: str) -> str:
    parts = ["beamkit", *path.removesuffix(".py").split("/")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _load_time_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The imports a module runs when it is imported: its top level, top-level ``try`` and ``if`` blocks, but not
    ``if TYPE_CHECKING:`` (never run) nor function bodies (run on first use)."""
    found: list[ast.Import | ast.ImportFrom] = []
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
            stack += node.body + node.orelse
        elif isinstance(node, ast.Try):
            stack += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
    return found


def _targets(node: ast.Import | ast.ImportFrom, path: str, names: set[str]) -> list[str]:
    """The modules an import statement of the module at ``path`` reaches (``from beamkit import ops`` reaches
    ``beamkit.ops``, ``from .decoder import X`` is resolved), given the ``names`` of every module."""
    module = _module_name(path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        up = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*up, *([node.module] if node.module else [])])
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in names else base for a in node.names]


def import_graph(trees: dict[str, ast.Module]) -> dict[tuple[str, str], set[str]]:
    """``(from room, to room) -> the importing modules``, for every load-time import of a beamkit module from
    another room (``from beamkit import ops`` reaches ``ops``; ``from .decoder import X`` is resolved)."""
    names = {_module_name(path) for path in trees}
    edges: dict[tuple[str, str], set[str]] = defaultdict(set)
    for path, tree in trees.items():
        module = _module_name(path)
        for node in _load_time_imports(tree):
            for target in _targets(node, path, names):
                if target.split(".")[0] == "beamkit" and room(target) != room(module):
                    edges[(room(module), room(target))].add(module)
    return dict(edges)


def cycles(edges: dict[tuple[str, str], set[str]]) -> list[list[str]]:
    """The rooms that reach each other (strongly connected groups of more than one room), each sorted."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    reached = {r: reach(r) for r in list(graph)}
    groups = {tuple(sorted({r} | {o for o in reached[r] if r in reached.get(o, set())})) for r in reached}
    return sorted(list(g) for g in groups if len(g) > 1)


def test_the_cycle_detector_finds_a_planted_cycle():
    trees = {
        "cli/tasks.py": ast.parse("from beamkit.tasks import dates\nfrom beamkit import ops"),
        "tasks/__init__.py": ast.parse('"""doc"""'),
        "tasks/dates.py": ast.parse("from ..cli import format\nfrom . import train"),
        "tasks/train.py": ast.parse("import typing\nif typing.TYPE_CHECKING:\n    from beamkit.ops import x"),
        "cli/format.py": ast.parse("def f():\n    from beamkit.ops import y"),
        "ops.py": ast.parse("import numpy"),
    }
    edges = import_graph(trees)
    assert edges == {
        ("cli", "tasks"): {"beamkit.cli.tasks"},
        ("cli", "ops"): {"beamkit.cli.tasks"},
        ("tasks", "cli"): {"beamkit.tasks.dates"},
    }
    assert cycles(edges) == [["cli", "tasks"]]
    del edges[("tasks", "cli")]
    assert cycles(edges) == []


def test_no_import_cycle_between_packages():
    edges = import_graph(modules())
    found = {
        " <-> ".join(group): {f"{a} -> {b}": sorted(edges[(a, b)]) for a, b in edges if a in group and b in group}
        for group in cycles(edges)
    }
    assert not found, f"these packages import each other at load time (break the cycle): {found}"


# Rooms that sit below others never import them, not even inside a function: "room -> rooms it must not import"
# with why.
FORBIDDEN_IMPORTS = {
    "models": (
        ("tasks", "adapters", "corpus", "serve", "cli"),
        "models are networks, step functions and their checkpoints; a task (its data, settings and runs), an "
        "adapter (a model as the commands and the server drive it), a corpus run, the server and the commands use "
        "them, never the other way round",
    ),
}


def forbidden_imports(trees: dict[str, ast.Module], rules: dict[str, tuple[tuple[str, ...], str]]) -> list[str]:
    """``"file:line -> module"`` for every import statement anywhere in a module (top level, function bodies,
    ``if TYPE_CHECKING:`` blocks) that reaches a room its own room must not import."""
    names = {_module_name(path) for path in trees}
    found = []
    for path, tree in trees.items():
        banned = rules.get(room(_module_name(path)), ((), ""))[0]
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found += [
                    f"{path}:{node.lineno} -> {target}"
                    for target in _targets(node, path, names)
                    if target.split(".")[0] == "beamkit" and room(target) in banned
                ]
    return sorted(set(found))


def test_the_forbidden_import_detector_finds_planted_imports():
    trees = {
        "models/a.py": ast.parse(
            "import typing\nfrom beamkit.search import x\nif typing.TYPE_CHECKING:\n    from beamkit.tasks import d\n"
            "def f():\n    import beamkit.tasks.train\n    from ..tasks.dates import split\n"
        ),
        "models/__init__.py": ast.parse("from beamkit.models.a import f"),
        "tasks/dates.py": ast.parse("from beamkit.models import a"),
        "tasks/__init__.py": ast.parse('"""doc"""'),
    }
    assert forbidden_imports(trees, {"models": (("tasks",), "why")}) == [
        "models/a.py:4 -> beamkit.tasks",
        "models/a.py:6 -> beamkit.tasks.train",
        "models/a.py:7 -> beamkit.tasks.dates",
    ]
    assert forbidden_imports(trees, {"tasks": (("models",), "why")}) == ["tasks/dates.py:1 -> beamkit.models.a"]


def test_no_import_of_a_room_above():
    found = forbidden_imports(modules(), FORBIDDEN_IMPORTS)
    why = "; ".join(f"{r}: {reason}" for r, (_, reason) in FORBIDDEN_IMPORTS.items())
    assert not found, f"these modules import a room above their own ({why}): {found}"


def all_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import a module can run: at load time and inside its functions (run on first use), but not under
    ``if TYPE_CHECKING:`` (never run)."""
    hidden = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in hidden]


def run_time_graph(trees: dict[str, ast.Module]) -> dict[tuple[str, str], set[str]]:
    """As :func:`import_graph`, but counting the imports inside functions too (``"file:line"`` per edge)."""
    names = {_module_name(path) for path in trees}
    edges: dict[tuple[str, str], set[str]] = defaultdict(set)
    for path, tree in trees.items():
        module = _module_name(path)
        for node in all_imports(tree):
            for target in _targets(node, path, names):
                if target.split(".")[0] == "beamkit" and room(target) != room(module):
                    edges[(room(module), room(target))].add(f"{path}:{node.lineno}")
    return dict(edges)


def test_the_run_time_cycle_detector_sees_imports_inside_functions():
    trees = {
        "models/g2p.py": ast.parse(
            "import typing\nif typing.TYPE_CHECKING:\n    from beamkit.adapters import T\n"
            "class G:\n    def decode(self):\n        from beamkit.adapters import decode_texts\n"
        ),
        "adapters/g2p.py": ast.parse("from beamkit.models.g2p import G"),
        "adapters/__init__.py": ast.parse('"""doc"""'),
        "models/__init__.py": ast.parse('"""doc"""'),
    }
    assert import_graph(trees) == {("adapters", "models"): {"beamkit.adapters.g2p"}}  # load time: no cycle
    edges = run_time_graph(trees)
    assert edges == {("models", "adapters"): {"models/g2p.py:6"}, ("adapters", "models"): {"adapters/g2p.py:1"}}
    assert cycles(edges) == [["adapters", "models"]]


def test_no_import_cycle_between_packages_counting_imports_inside_functions():
    edges = run_time_graph(modules())
    found = {
        " <-> ".join(group): {f"{a} -> {b}": sorted(edges[(a, b)]) for a, b in edges if a in group and b in group}
        for group in cycles(edges)
    }
    assert not found, f"these packages import each other, inside functions too (import down a floor only): {found}"


# The Hugging Face bridge's rooms, top floor first: a module imports only its own room and the floors below
# (hf/__init__.py re-exports from all of them). Modules directly in hf/ (errors, internals, versions, loading,
# pickles, quantize) are the ground floor every room may use.
HF_FLOORS = {"bridge": 3, "loop": 2, "retrieval": 2, "steps": 1, "": 0}


def hf_room(module: str) -> str:
    """The room of a module under ``beamkit.hf`` (``beamkit.hf.steps.paged`` -> ``steps``; ``beamkit.hf.errors``
    -> ``""``, the ground floor)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[2] in HF_FLOORS else ""


def hf_upward_imports(trees: dict[str, ast.Module]) -> list[str]:
    """``"file:line -> module"`` for every import (inside functions too) of an hf/ module that reaches another
    hf room on its own floor or above."""
    names = {_module_name(path) for path in trees}
    found = []
    for path, tree in trees.items():
        if not path.startswith("hf/") or path == "hf/__init__.py":
            continue
        own = hf_room(_module_name(path))
        for node in all_imports(tree):
            for target in _targets(node, path, names):
                if not target.startswith("beamkit.hf."):
                    continue
                other = hf_room(target)
                if other != own and HF_FLOORS.get(other, 0) >= HF_FLOORS[own]:
                    found.append(f"{path}:{node.lineno} -> {target}")
    return sorted(found)


def test_the_hf_floor_detector_finds_planted_upward_imports():
    trees = {
        "hf/steps/step.py": ast.parse("from beamkit.hf.errors import U\ndef f():\n    from beamkit.hf.bridge import r"),
        "hf/loop/decoding.py": ast.parse("from beamkit.hf.steps.step import S\nfrom beamkit.hf.retrieval import a"),
        "hf/bridge/route.py": ast.parse("def g():\n    from beamkit.hf.loop.decoding import decode"),
        "hf/errors.py": ast.parse("from beamkit.hf.steps import step"),
    }
    assert hf_upward_imports(trees) == [
        "hf/errors.py:1 -> beamkit.hf.steps.step",
        "hf/loop/decoding.py:2 -> beamkit.hf.retrieval",
        "hf/steps/step.py:3 -> beamkit.hf.bridge",
    ]


def test_hf_rooms_import_only_the_floors_below():
    found = hf_upward_imports(modules())
    assert not found, f"an hf room imports one on its floor or above (move the shared part down): {found}"


# ---------------------------------------------------------------------------------------------------------------
# writes onto a caller's model

# names a library function receives a caller's model or config under
MODEL_NAMES = {"model", "config"}
# writes onto a model kept on purpose, as "file: count  # why"
MODEL_WRITES = {
    "hf/bridge/patching.py": 2,  # patch(model) replaces model.generate (its whole point) and undo() restores it
}


def _chain(node: ast.expr) -> list[str]:
    """The names of an attribute / subscript chain, root first (``self.model.lm_head`` -> self, model, lm_head;
    ``model.__dict__["x"]`` -> model, __dict__); empty when the root is not a name."""
    names: list[str] = []
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Attribute):
            names.append(node.attr)
        node = node.value
    return [node.id, *reversed(names)] if isinstance(node, ast.Name) else []


def _onto_model(target: ast.expr, params: set[str]) -> bool:
    """Whether writing ``target`` changes an object the caller handed over as a model or a config: its chain
    starts at such a parameter (``model.x``, ``config.y``, ``model.__dict__[k]``) or passes through an attribute
    of that name (``self.model.z``), but not ``self.model`` itself (a reference kept, nothing written onto it)."""
    chain = _chain(target)
    return len(chain) >= 2 and (chain[0] in params or bool(MODEL_NAMES & set(chain[1:-1])))


def _writes(node: ast.AST) -> list[ast.expr]:
    """What an assignment, augmented or annotated assignment or ``del`` statement writes (tuples unpacked)."""
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    elif isinstance(node, ast.Delete):
        targets = node.targets
    else:
        return []
    return [item for t in targets for item in (t.elts if isinstance(t, ast.Tuple) else [t])]


def _written_through_call(node: ast.AST, params: set[str]) -> bool:
    """``setattr`` / ``delattr`` / ``object.__setattr__`` on a model or a config a function was handed."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if name not in ("setattr", "delattr", "__setattr__", "__delattr__") or not node.args:
        return False
    chain = _chain(node.args[0])
    return bool(chain) and (chain[0] in params or bool(MODEL_NAMES & set(chain[1:])))


def _vars_item(item: ast.expr, params: set[str]) -> bool:
    """``vars(model)[k]`` of a model or config a function was handed."""
    if not (isinstance(item, ast.Subscript) and isinstance(item.value, ast.Call)):
        return False
    call = item.value
    return (
        isinstance(call.func, ast.Name)
        and call.func.id == "vars"
        and any(bool(set(_chain(x)[:1]) & params) for x in call.args)
    )


def model_writes(tree: ast.Module) -> list[int]:
    """Line numbers of writes onto a model or a config a function was handed (a parameter named ``model`` or
    ``config``, or an attribute of that name): assignments (plain, augmented, annotated) and ``del`` of an
    attribute or item reached through one (see :func:`_onto_model`), ``setattr`` / ``delattr`` /
    ``object.__setattr__`` on one, and ``vars(model)[...] = ...``. A model a function makes itself (a local
    ``model = load(...)``) is its own to set up."""
    found = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = fn.args
        params = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]} & MODEL_NAMES
        for node in ast.walk(fn):  # names bound to a part of one (``config = model.config``) are one too
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                chain = _chain(node.value)
                if chain and (chain[0] in params or MODEL_NAMES & set(chain[1:])):
                    params.add(node.targets[0].id)
        for node in ast.walk(fn):
            if _written_through_call(node, params):
                found.add(node.lineno)
            found.update(node.lineno for item in _writes(node) if _vars_item(item, params) or _onto_model(item, params))
    return sorted(found)


PLANTED_WRITES = """
def f(model, config, other):
    model.lm_head = head
    config._attn_implementation_internal = "x"
    setattr(model, "x", 1)
    object.__setattr__(config, "y", 2)
    model.__dict__["_steps"] = {}
    vars(model)["z"] = 3
    self.model.generate = g
    del model.cache
    model.count += 1
    cfg = model.config
    cfg.use_cache = False
    # not writes onto a model: a reference kept, other objects, reading, a model the function made itself
    self.model = model
    other.x = model.lm_head
    view = copy(model); view.lm_head = head
    setattr(other, "model", model)
def g():
    model = load()
    model.meta = {}
"""


def test_the_model_write_detector_finds_planted_writes_and_nothing_else():
    assert model_writes(ast.parse(PLANTED_WRITES)) == [3, 4, 5, 6, 7, 8, 9, 10, 11, 13]


def test_no_writes_onto_a_callers_model():
    found = {
        path: lines for path, tree in modules().items() if len(lines := model_writes(tree)) != MODEL_WRITES.get(path, 0)
    }
    assert not found, f"keep such state beside the model, not on it (file: lines): {found}"


# ---------------------------------------------------------------------------------------------------------------
# 6. short functions in the application rooms

# The rooms that wire the library to its users (commands, server, corpus runs, tasks, model adapters, the Hugging
# Face bridge, the CTC front end): a function there reads at a glance. The numeric rooms (search, the CTC kernel,
# lm, models, variants, viz, ops) are left out: a compiled kernel or a loop over a tensor may be long for speed.
APPLICATION_ROOMS = (
    "cli/",
    "serve/",
    "corpus/",
    "tasks/",
    "adapters/",
    "hf/",
    "openvino/",
    "ctc/decoder.py",
    "ctc/prefix_search.py",
    "ctc/ocr.py",
    "ctc/compat/",
)
MAX_FUNCTION_LINES = 60
# Functions allowed to stay longer for now, each with why. Remove an entry once its function is split.
LONG_FUNCTIONS: set[str] = set()  # none left: a function that must stay long is named here with its reason


def long_functions(tree: ast.Module, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """Every function or method (nested ones too) longer than ``limit`` lines, from its ``def`` line to its last
    line, by name."""
    return {
        node.name: node.end_lineno - node.lineno + 1
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > limit
    }


def test_the_length_detector_finds_a_planted_long_function():
    def body(indent: int) -> str:
        return "\n".join(" " * indent + f"x{i} = {i}" for i in range(5))

    planted = "\n".join(
        ["def short():", body(4), "class A:", "    def long(self):", body(8), body(8), "        def inner():", body(12)]
    )
    assert long_functions(ast.parse(planted), limit=6) == {"long": 17}
    assert long_functions(ast.parse(planted), limit=5) == {"short": 6, "long": 17, "inner": 6}


def test_no_long_functions_in_the_application_rooms():
    found = {
        f"{path}:{name}": lines
        for path, tree in modules().items()
        if path.startswith(APPLICATION_ROOMS)
        for name, lines in long_functions(tree).items()
        if f"{path}:{name}" not in LONG_FUNCTIONS
    }
    assert not found, f"split these functions (at most {MAX_FUNCTION_LINES} lines each): {found}"
    gone = [key for key in LONG_FUNCTIONS if key.split(":")[1] not in long_functions(modules()[key.split(":")[0]])]
    assert not gone, f"these functions are short now: drop them from LONG_FUNCTIONS: {gone}"


# ---------------------------------------------------------------------------------------------------------------
# the compiled CTC kernel takes records, not its workspace array by array


def test_the_ctc_kernel_takes_at_most_eight_parameters():
    tree = modules()["ctc/prefix/kernel.py"]
    (run_frames,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run_frames"]
    names = [a.arg for a in run_frames.args.args]
    assert len(names) <= 8, f"run_frames takes {len(names)} parameters: {names}"


# Every CTC function (the kernels, the search, the front end) takes at most eight parameters: more travel bundled
# (a record of arrays, a knobs tuple, an options object). Allowed: a function whose flat signature a numba-compiled
# kernel needs, or a drop-in's signature copied from its peer; each named with why. A stale entry fails.
MAX_CTC_PARAMETERS = 8
CTC_WIDE_FUNCTIONS: dict[str, str] = {
    "ctc/compat/torchaudio.py:ctc_decoder": "torchaudio's ctc_decoder signature (the drop-in), 16 parameters",
    "ctc/compat/torchaudio.py:__init__": "torchaudio's CTCDecoder(nbest, lexicon, ..., unk_word) constructor",
}


def wide_functions(tree: ast.Module, limit: int = MAX_CTC_PARAMETERS) -> dict[str, int]:
    """Every function or method (nested ones too) taking more than ``limit`` parameters (``self`` / ``cls`` not
    counted; ``*args`` and ``**kwargs`` count one each), by name."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            named = [*a.posonlyargs, *a.args, *a.kwonlyargs]
            n = len(named) + (a.vararg is not None) + (a.kwarg is not None)
            if named and named[0].arg in ("self", "cls"):
                n -= 1
            if n > limit:
                found[node.name] = n
    return found


def test_the_width_detector_finds_a_planted_wide_function():
    planted = "def f(a, b, c, *d, e, **g): pass\nclass A:\n    def m(self, a, b, c, d): pass\n    def n(a, b): pass"
    assert wide_functions(ast.parse(planted), limit=5) == {"f": 6}
    assert wide_functions(ast.parse(planted), limit=3) == {"f": 6, "m": 4}


def test_no_ctc_function_takes_more_than_eight_parameters():
    found = {
        f"{path}:{name}": n
        for path, tree in modules().items()
        if path.startswith("ctc/")
        for name, n in wide_functions(tree).items()
        if f"{path}:{name}" not in CTC_WIDE_FUNCTIONS
    }
    assert not found, f"bundle these functions' parameters (at most {MAX_CTC_PARAMETERS}): {found}"
    gone = [k for k in CTC_WIDE_FUNCTIONS if k.split(":")[1] not in wide_functions(modules()[k.split(":")[0]])]
    assert not gone, (
        f"these functions take at most {MAX_CTC_PARAMETERS} parameters now: drop them from CTC_WIDE_FUNCTIONS: {gone}"
    )


# ---------------------------------------------------------------------------------------------------------------
# package __init__ files only re-export

# the names an __init__ may bind besides its imports (``__getattr__`` only as an allowed lazy import, see above)
REEXPORT_NAMES = {"__all__", "__getattr__", "__version__"}


def package_definitions(tree: ast.Module) -> list[int]:
    """Line numbers of what a package ``__init__`` does beyond re-exporting: any statement but its docstring,
    imports, and binding ``__all__`` / ``__getattr__`` (moved or lazily imported names) / ``__version__``."""
    found = []
    for i, node in enumerate(tree.body):
        if isinstance(node, (ast.Import, ast.ImportFrom)) or (i == 0 and isinstance(node, ast.Expr)):
            continue
        if isinstance(node, ast.Assign) and all(
            isinstance(t, ast.Name) and t.id in REEXPORT_NAMES for t in node.targets
        ):
            continue
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            continue
        found.append(node.lineno)
    return found


def test_the_package_detector_finds_a_planted_definition():
    planted = '"""doc"""\nfrom a import b\n__all__ = ["b"]\nX = 1\ndef helper(): pass\ndef __getattr__(n): pass\n'
    assert package_definitions(ast.parse(planted)) == [4, 5]


def test_package_init_files_only_re_export():
    found = {
        path: lines
        for path, tree in modules().items()
        if path.endswith("__init__.py") and (lines := package_definitions(tree))
    }
    assert not found, f"move these definitions into a module of the package and re-export them: {found}"
