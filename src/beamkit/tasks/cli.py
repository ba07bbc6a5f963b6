"""Moved to :mod:`beamkit.cli.tasks`; this import path keeps working for one release, with a DeprecationWarning."""

import warnings
from typing import Any

from beamkit.cli import tasks as _moved

warnings.warn("beamkit.tasks.cli moved to beamkit.cli.tasks; import it from there", DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    """Every name of :mod:`beamkit.cli.tasks`."""
    return getattr(_moved, name)
