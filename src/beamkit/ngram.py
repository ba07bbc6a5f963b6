"""Moved to :mod:`beamkit.lm` (``beamkit.lm.NGramLM``); this import path keeps working for one release, with a
DeprecationWarning."""

from beamkit.moved import forward

__getattr__ = forward(__name__, {"NGramLM": "beamkit.lm", "LN10": "beamkit.lm.ngram"})
