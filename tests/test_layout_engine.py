"""The engine's layout, read from the source with ``ast``: ``Engine`` keeps the loop and the events and hands
itself to no collaborator; the strategies (policies, the expander, the ranker, the scoring, the recorders) see
arrays, records and the book, never the engine.

Each detector is also run on a planted snippet, so a detector that finds nothing cannot pass for a clean tree.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "beamkit"
ENGINE = SRC / "search" / "engine.py"
MAX_ENGINE_LINES = 500
# the modules that drive an engine (they create one, add requests and step it): they may name it
DRIVERS = {"search/engine.py", "search/drivers.py", "search/__init__.py"}


def self_handed_out(tree: ast.Module) -> list[str]:
    """``"Class.method:line"`` for every place a method hands its own ``self`` to something else: ``self`` as an
    argument of a call (``Policy(self)``, ``policy.step(view, self)``, ``f(x=self)``), or stored on another object
    (``other.engine = self``), or put in a container (``[self]``, ``{"e": self}``)."""
    found = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for fn in (n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            where = f"{cls.name}.{fn.name}"
            for node in ast.walk(fn):
                lines: list[int] = []
                if isinstance(node, ast.Call):
                    args = [*node.args, *(k.value for k in node.keywords)]
                    args = [a.value if isinstance(a, ast.Starred) else a for a in args]
                    lines += [node.lineno for a in args if _is_self(a)]
                elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    if node.value is not None and _is_self(node.value):
                        lines += [node.lineno for t in targets if not isinstance(t, ast.Name)]
                elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
                    lines += [node.lineno for e in node.elts if _is_self(e)]
                elif isinstance(node, ast.Dict):
                    lines += [node.lineno for v in node.values if v is not None and _is_self(v)]
                found += [f"{where}:{line}" for line in lines]
    return sorted(set(found))


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def names_used(tree: ast.Module, name: str) -> list[int]:
    """Lines where ``name`` is used as code (a name, an attribute, an import or a string annotation), not in
    docstrings or comments."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == name:
            lines.append(node.lineno)
        elif isinstance(node, ast.Attribute) and node.attr == name:
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and any(a.name == name for a in node.names):
            lines.append(node.lineno)
        elif isinstance(node, ast.arg) and node.annotation is not None:
            ann = node.annotation
            if isinstance(ann, ast.Constant) and isinstance(ann.value, str) and name in ann.value.split("|"):
                lines.append(node.lineno)
    return sorted(set(lines))


PLANTED = """
class Engine:
    def __init__(self):
        self.recorder = Recorder(self)
        self.policy = make(engine=self)
        self.other.owner = self
        self.ok = self.book
        me = self
        self.pair = [self, 1]
        self.by = {"e": self}

    def step(self):
        self.policy.step(self.view, *[self])
        return self.policy.step(self.view, self.book)
"""


def test_the_self_detector_finds_planted_hand_outs_and_nothing_else():
    assert self_handed_out(ast.parse(PLANTED)) == [
        "Engine.__init__:10",
        "Engine.__init__:4",
        "Engine.__init__:5",
        "Engine.__init__:6",
        "Engine.__init__:9",
        "Engine.step:13",
    ]


def test_the_name_detector_finds_code_not_prose():
    tree = ast.parse(
        '"""An Engine in a docstring."""\nfrom beamkit.search.engine import Engine\n# Engine in a comment\n'
        'def f(e: "Engine", x: int) -> None:\n    """Engine."""\n    return mod.Engine\n'
    )
    assert names_used(tree, "Engine") == [2, 4, 6]


def test_the_engine_hands_itself_to_no_collaborator():
    """Policies, recorders, the expander, the ranker and the scoring take arrays, records and the book."""
    found = self_handed_out(ast.parse(ENGINE.read_text(encoding="utf-8")))
    assert not found, f"the engine hands itself out at {found}: give the collaborator the columns or a record"


def test_no_strategy_module_names_the_engine():
    """Only the drivers (and the engine's own module) name ``Engine``; every other module of the search, the
    variants and the trace works on what it is handed."""
    rooms = [*(SRC / "search").glob("*.py"), *(SRC / "variants").glob("*.py"), SRC / "trace.py"]
    found = {}
    for path in rooms:
        rel = path.relative_to(SRC).as_posix()
        if rel in DRIVERS:
            continue
        lines = names_used(ast.parse(path.read_text(encoding="utf-8")), "Engine")
        if lines:
            found[rel] = lines
    assert not found, f"these modules name the engine (take its columns or a record instead): {found}"


def test_the_engine_module_stays_small():
    """``Engine`` keeps the loop and the events (requests join, finish, fail); the step's stages live in their
    own modules."""
    lines = len(ENGINE.read_text(encoding="utf-8").splitlines())
    assert lines < MAX_ENGINE_LINES, f"search/engine.py has {lines} lines (at most {MAX_ENGINE_LINES - 1})"
    classes = [n.name for n in ast.parse(ENGINE.read_text(encoding="utf-8")).body if isinstance(n, ast.ClassDef)]
    assert classes == ["Engine"]


def test_the_trace_module_imports_nothing_above_it():
    """``beamkit.trace`` is plain data: it imports neither the search nor the drawing code, at any level."""
    tree = ast.parse((SRC / "trace.py").read_text(encoding="utf-8"))
    imported = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    ]
    assert not [m for m in imported if m and m.startswith(("beamkit.viz", "beamkit.search"))], imported
