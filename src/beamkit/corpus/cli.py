"""Moved to :mod:`beamkit.cli.corpus`; this import path keeps working for one release, with a DeprecationWarning."""

import warnings
from typing import Any

from beamkit.cli import corpus as _moved

warnings.warn("beamkit.corpus.cli moved to beamkit.cli.corpus; import it from there", DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    """Every name of :mod:`beamkit.cli.corpus`."""
    return getattr(_moved, name)
