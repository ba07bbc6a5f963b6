"""What the Hugging Face bridge raises for a call it does not reproduce: :class:`Unsupported`, shared by every room
of :mod:`beamkit.hf` (the bridge refuses settings, the loop modes, the output layer models)."""

from __future__ import annotations


class Unsupported(ValueError):
    """A setting that beamkit.hf does not reproduce exactly (``beamkit.hf.patch`` hands such calls to Hugging
    Face's own ``generate``)."""
