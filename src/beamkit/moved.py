"""Names that moved: a module keeps its old names for one release through :func:`forward` (its module-level
``__getattr__``), each use warning (DeprecationWarning) where the name lives now."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def forward(module: str, moves: Mapping[str, str | tuple[str, str]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``module``: each old name of ``moves`` maps to its new home, a module
    (``"beamkit.lm"``: the same name there) or a dotted name (``"beamkit.ctc.lm.Hotwords"``: renamed); using
    it warns (DeprecationWarning) and returns the object; any other name is an AttributeError. A ``(target,
    advice)`` pair warns with ``advice`` (what to use instead) in place of the new import path."""

    def __getattr__(name: str) -> Any:
        """The moved object ``name``, with a DeprecationWarning naming its new import path."""
        move = moves.get(name)
        if move is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        target, advice = move if isinstance(move, tuple) else (move, "")
        where, _, new = target.rpartition(".")
        try:
            obj = getattr(importlib.import_module(target), name)
            where, new = target, name
        except ModuleNotFoundError:
            obj = getattr(importlib.import_module(where), new)
        said = advice or f"moved to {where}.{new}; import it from there"
        warnings.warn(
            f"{module}.{name} {said} (the old name goes in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        return obj

    return __getattr__
