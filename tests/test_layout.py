"""The layout rules, read from the source with ``ast``: argument checks go through ``beamkit._checks``, torch code
stays in its homes, and no public class or function is defined in two modules.

Each rule's detector is also run on a planted snippet, so a detector that finds nothing cannot pass for a clean
tree. The few checks kept inline on purpose are counted per file (a new one fails the test).
"""

from __future__ import annotations

import ast
import warnings
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
TORCH_HOMES = ("ops.py", "hf/", "kv/", "models/", "compat/", "ctc/compat/torchaudio.py")


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
# beamkit's own.
DROP_INS = ("compat/", "ctc/compat/torchaudio.py")


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
# moved names keep their old paths for one release


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("beamkit.tasks.train:train", "beamkit.models.training:train"),
        ("beamkit.samplers:stochastic_beam_search", "beamkit.variants.stochastic:stochastic_beam_search"),
        ("beamkit.samplers:GumbelTopK", "beamkit.variants.stochastic:GumbelTopK"),
        ("beamkit.samplers:as_float64", "beamkit.ops:plus_offset64"),
        ("beamkit.samplers:gather_cols", "beamkit.ops:gather_cols"),
        ("beamkit.tasks.dates:render", "beamkit.tasks.dates:render_date"),
        ("beamkit.tasks.g2p:split", "beamkit.tasks.g2p:word_split"),
        ("beamkit.tasks.g2p:lm_corpus", "beamkit.tasks.g2p:phoneme_corpus"),
        ("beamkit.demo:TABLE", "beamkit.demo:DEMO_PROBS"),
        ("beamkit.models.checkpoint:FORMAT", "beamkit.models.checkpoint:CHECKPOINT_FORMAT"),
        ("beamkit.models.checkpoint:BACKENDS", "beamkit.models.checkpoint:MODEL_BACKENDS"),
        ("beamkit.search.options:Policy", "beamkit.search.options:PolicyName"),
        ("beamkit.models.checkpoint:load", "beamkit.models.checkpoint:load_checkpoint"),
        ("beamkit.corpus.decoder:Decoder", "beamkit.corpus.decoder:CorpusDecoder"),
        ("beamkit.corpus:Decoder", "beamkit.corpus.decoder:CorpusDecoder"),
        ("beamkit.serve.runner:Progress", "beamkit.serve.runner:Update"),
    ],
)
def test_moved_names_warn_at_their_old_path(old, new):
    import importlib

    (old_module, old_name), (new_module, new_name) = old.split(":"), new.split(":")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(importlib.import_module(old_module), old_name)
    assert value is getattr(importlib.import_module(new_module), new_name)
    assert [w.category for w in caught] == [DeprecationWarning]
    assert str(caught[0].message) == (
        f"{old_module}.{old_name} moved to {new_module}.{new_name}; import it from there"
        " (the old name goes in the next release)"
    )


def test_an_unknown_name_of_a_module_with_moved_names_is_an_attribute_error():
    import beamkit.demo

    with pytest.raises(AttributeError, match="^module 'beamkit.demo' has no attribute 'NOTHING'$"):
        beamkit.demo.NOTHING  # noqa: B018


# ---------------------------------------------------------------------------------------------------------------
# the compiled CTC kernel takes records, not its workspace array by array


def test_the_ctc_kernel_takes_at_most_eight_parameters():
    tree = modules()["ctc/kernel.py"]
    (run_frames,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run_frames"]
    names = [a.arg for a in run_frames.args.args]
    assert len(names) <= 8, f"run_frames takes {len(names)} parameters: {names}"


# ---------------------------------------------------------------------------------------------------------------
# package __init__ files only re-export

REEXPORT_NAMES = {"__all__", "__getattr__", "__version__"}  # the names an __init__ may bind besides its imports


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
