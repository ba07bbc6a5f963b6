"""Deprecated: the model adapters moved to :mod:`beamkit.adapters` (one layer for every command and the server).

``from beamkit.serve.adapters import ModelAdapter, load_adapter`` keeps working for one release, with a
DeprecationWarning: use ``beamkit.adapters.ModelAdapter`` and ``beamkit.adapters.load``.
"""

from __future__ import annotations

import warnings
from typing import Any

from beamkit.adapters.base import ModelAdapter

_MOVED = {
    "DatesAdapter": ("beamkit.adapters.checkpoint", "CheckpointAdapter"),
    "HFAdapter": ("beamkit.adapters.hf", "HFAdapter"),
    "load_adapter": ("beamkit.adapters.load", "load"),
    "PICKLED": ("beamkit.hf.loading", "PICKLED"),
    "SEQ2SEQ_MAX_SOURCE": ("beamkit.adapters.checkpoint", "SEQ2SEQ_MAX_SOURCE"),
}

__all__ = ["ModelAdapter"]


def __getattr__(name: str) -> Any:
    """The moved names, each with a DeprecationWarning naming its new place."""
    if name not in _MOVED:
        raise AttributeError(f"module 'beamkit.serve.adapters' has no attribute {name!r}")
    import importlib

    module, new = _MOVED[name]
    warnings.warn(
        f"beamkit.serve.adapters.{name} moved to {module}.{new}; the old name goes away in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(module), new)
