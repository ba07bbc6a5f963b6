"""Search variants built on the engine: diverse, lexically constrained, exact and stochastic beam search."""

from beamkit.variants.constrained import Constrained, constrained_beam_search, meets_constraints
from beamkit.variants.diverse import Diverse, diverse_beam_search
from beamkit.variants.exact import ExactResult, SearchErrors, exact_search, exact_search_stats, search_errors
from beamkit.variants.stochastic import GumbelTopK, PrefixTable, Sample, stochastic_beam_search, truncated_gumbel

__all__ = [
    "Constrained",
    "Diverse",
    "ExactResult",
    "GumbelTopK",
    "PrefixTable",
    "Sample",
    "SearchErrors",
    "constrained_beam_search",
    "diverse_beam_search",
    "exact_search",
    "exact_search_stats",
    "meets_constraints",
    "search_errors",
    "stochastic_beam_search",
    "truncated_gumbel",
]
