"""Moved to :mod:`beamkit.lm` (``beamkit.lm.build_arpa``, ``beamkit.lm.write_arpa``); this import path keeps
working for one release, with a DeprecationWarning."""

from beamkit.moved import forward

__getattr__ = forward(__name__, {"build_arpa": "beamkit.lm", "write_arpa": "beamkit.lm"})
