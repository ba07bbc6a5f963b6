"""Word n-gram language models (numpy only; ``kenlm`` optional): the ARPA reader, the KenLM wrapper, the
interpolated modified Kneser-Ney builder, and :class:`NGramLM`, a token-level n-gram step function for
seq2seq fusion (:func:`beamkit.fuse`). CTC decoding fuses these models by its own rules
(:mod:`beamkit.ctc.lm`)."""

from .arpa import SPECIAL_WORDS, ArpaLM, NGramModel, load_unigrams_from_arpa
from .kenlm_model import KENLM_MAX_ORDER, KenLMModel, kenlm_available, load_language_model
from .kneser_ney import build_arpa, write_arpa
from .ngram import NGramLM

__all__ = [
    "KENLM_MAX_ORDER",
    "SPECIAL_WORDS",
    "ArpaLM",
    "KenLMModel",
    "NGramLM",
    "NGramModel",
    "build_arpa",
    "kenlm_available",
    "load_language_model",
    "load_unigrams_from_arpa",
    "write_arpa",
]
