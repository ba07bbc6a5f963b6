"""Moved to :mod:`beamkit.cli.serve`; this import path keeps working for one release, with a DeprecationWarning."""

import warnings
from typing import Any

from beamkit.cli import serve as _moved

warnings.warn("beamkit.serve.cli moved to beamkit.cli.serve; import it from there", DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    """Every name of :mod:`beamkit.cli.serve`."""
    return getattr(_moved, name)
