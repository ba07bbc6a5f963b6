"""beamkit: beam-search decoding for any sequence model.

One engine (:class:`Engine`, step-wise: requests join and leave at every step) runs every search; ``beam_search``
/ ``greedy_decode`` decode one request and ``search_batch`` many at once, all with a step function
``step_fn(state, y_prev) -> (logits [rows, V], state)``.
"""

from beamkit.constraints import Trie, TrieMask
from beamkit.decode import beam_search, greedy_decode
from beamkit.fusion import Fused, fuse
from beamkit.hypothesis import BatchDecodeError, Hypothesis, SearchStats
from beamkit.lm import NGramLM
from beamkit.processors import (
    BadWords,
    ForcedPrefix,
    LogitsProcessor,
    MinLength,
    NoRepeatNGram,
    PrefixAllowedTokens,
    RepetitionPenalty,
    SequenceBias,
    StepContext,
    SuppressTokens,
    Temperature,
)
from beamkit.samplers import BeamSample, Multinomial, TopK, TopP
from beamkit.scoring import CoveragePenalty, FinalScorer, LengthPenalty
from beamkit.search import (
    BeamSearch,
    Completed,
    Deterministic,
    Engine,
    EngineStats,
    RequestOptions,
    SearchOptions,
    SearchResult,
    Selector,
    search_batch,
)
from beamkit.state import Shared, concat_state, select_state
from beamkit.variants import (
    Constrained,
    Diverse,
    GumbelTopK,
    constrained_beam_search,
    diverse_beam_search,
    exact_search,
    exact_search_stats,
    search_errors,
    stochastic_beam_search,
)

__all__ = [
    "BeamSample",
    "Constrained",
    "Diverse",
    "GumbelTopK",
    "Multinomial",
    "TopK",
    "TopP",
    "constrained_beam_search",
    "diverse_beam_search",
    "exact_search",
    "exact_search_stats",
    "search_errors",
    "stochastic_beam_search",
    "BadWords",
    "BatchDecodeError",
    "BeamSearch",
    "Completed",
    "Engine",
    "EngineStats",
    "CoveragePenalty",
    "Deterministic",
    "FinalScorer",
    "Fused",
    "ForcedPrefix",
    "Hypothesis",
    "LengthPenalty",
    "LogitsProcessor",
    "MinLength",
    "NGramLM",
    "NoRepeatNGram",
    "PrefixAllowedTokens",
    "RepetitionPenalty",
    "RequestOptions",
    "SequenceBias",
    "SearchOptions",
    "SearchResult",
    "SearchStats",
    "Selector",
    "Shared",
    "StepContext",
    "SuppressTokens",
    "Temperature",
    "Trie",
    "TrieMask",
    "beam_search",
    "concat_state",
    "fuse",
    "greedy_decode",
    "search_batch",
    "select_state",
]

__version__ = "0.1.0"
