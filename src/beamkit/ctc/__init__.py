"""CTC decoding: greedy, prefix beam search with word n-gram fusion, and a pyctcdecode-shaped API.

The search is compiled by numba (the ``ctc`` extra: ``pip install ".[ctc]"``); without it the same code runs as
plain Python, much slower. ``kenlm`` is used when installed (optional), otherwise ARPA files are read in Python.
"""

from .decoder import CTCBatchDecodeError, CTCDecoder, build_ctcdecoder, normalize_logits
from .kneser_ney import build_arpa, write_arpa
from .lm import (
    ArpaLM,
    HotwordScorer,
    KenLMModel,
    LanguageModelFusion,
    UnigramPrefixIndex,
    kenlm_available,
    load_language_model,
    load_unigrams_from_arpa,
)
from .prefix_search import CTCHypothesis, greedy_decode, labels_to_text, log_softmax, prefix_beam_search
from .search import release_cached_memory
from .vocab import Vocabulary

__all__ = [
    "ArpaLM",
    "CTCBatchDecodeError",
    "CTCDecoder",
    "CTCHypothesis",
    "HotwordScorer",
    "KenLMModel",
    "LanguageModelFusion",
    "UnigramPrefixIndex",
    "Vocabulary",
    "build_arpa",
    "build_ctcdecoder",
    "greedy_decode",
    "kenlm_available",
    "labels_to_text",
    "load_language_model",
    "load_unigrams_from_arpa",
    "log_softmax",
    "normalize_logits",
    "prefix_beam_search",
    "release_cached_memory",
    "write_arpa",
]
