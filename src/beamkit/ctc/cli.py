"""Moved to :mod:`beamkit.cli.ctc`; this import path keeps working for one release, with a DeprecationWarning."""

import warnings
from typing import Any

from beamkit.cli import ctc as _moved

warnings.warn("beamkit.ctc.cli moved to beamkit.cli.ctc; import it from there", DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    """Every name of :mod:`beamkit.cli.ctc`."""
    return getattr(_moved, name)
