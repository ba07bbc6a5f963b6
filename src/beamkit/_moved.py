"""Old names that moved or were renamed keep working for one release: a module's ``__getattr__`` built here
finds them in their new home and warns (DeprecationWarning) with the new name."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any


def moved_names(module: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for ``module``: ``names`` maps each old name to its new home as
    ``"package.module:new_name"``; any other name is an AttributeError, as for a module without one."""

    def __getattr__(name: str) -> Any:
        target = names.get(name)
        if target is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        where, _, new = target.partition(":")
        warnings.warn(
            f"{module}.{name} moved to {where}.{new}; the old name goes away in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(where), new)

    return __getattr__
