"""Final sequence scorers (OLMo's ``FinalSequenceScorer`` protocol): how the returned hypotheses are scored and
sorted once the search is over. They do not change the search itself."""

from __future__ import annotations

from typing import Any

from beamkit._checks import check_float


class FinalSequenceScorer:
    """The protocol: ``score(predictions [batch, beam, steps], log_probabilities [batch, beam], end_index)``
    returns the final scores ``[batch, beam]``; the search sorts each batch element's hypotheses by them
    (descending). ``predictions`` are padded after a hypothesis's end token with more end tokens."""

    def score(self, predictions: Any, log_probabilities: Any, end_index: int) -> Any:
        """The final scores ``[batch, beam]`` (subclasses implement it)."""
        raise NotImplementedError


class SequenceLogProbabilityScorer(FinalSequenceScorer):
    """The default: a hypothesis's score is its log-probability."""

    def score(self, predictions: Any, log_probabilities: Any, end_index: int) -> Any:
        """``log_probabilities`` unchanged."""
        return log_probabilities


class LengthNormalizedSequenceLogProbabilityScorer(FinalSequenceScorer):
    """The log-probability divided by ``length ** length_penalty``, where the length counts the end token (when
    the hypothesis has one) and not the start token."""

    def __init__(self, length_penalty: float = 1.0):
        self.length_penalty = check_float("length_penalty", length_penalty)

    def score(self, predictions: Any, log_probabilities: Any, end_index: int) -> Any:
        """``log_probabilities / length ** length_penalty``; see the class docstring for the length."""
        # shape: (batch, beam) tokens before the end token, plus one for the end token itself
        lengths = (predictions != end_index).sum(dim=2) + (predictions[:, :, -1] == end_index)
        return log_probabilities / lengths**self.length_penalty  # the power in torch's default dtype, as OLMo
