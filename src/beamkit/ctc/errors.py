"""What a batch decode raises when some of its utterances cannot be decoded."""

from __future__ import annotations

from typing import Any

from ..hypothesis import BatchDecodeError


class CTCBatchDecodeError(BatchDecodeError):
    """Some utterances of a batch could not be decoded; the others' results are kept.

    ``errors`` maps an utterance index to the message of what went wrong with it; ``results`` is what the
    batch call returns, with an empty result (``""``, ``[]`` or None) for each failed utterance."""

    def __init__(self, errors: dict[int, str], results: list[Any]) -> None:
        """Hold ``errors`` and ``results``; the message names every failed utterance."""
        self.errors = errors
        self.results = results
        ValueError.__init__(self, "; ".join(f"utterance {i}: {msg}" for i, msg in sorted(errors.items())))
