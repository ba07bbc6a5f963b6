"""Where :func:`beamkit.moved.forward` was first defined; re-exported for the modules that import it from here."""

from beamkit.moved import forward

__all__ = ["forward"]
