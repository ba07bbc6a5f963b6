"""The knobs of one lexicon search (:class:`LexiconOptions`, frozen and checked once) and what it returns
(:class:`LexiconResult`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from beamkit._checks import check_bool, check_float, check_int

from ..options import MAX_BEAM_WIDTH


@dataclass(frozen=True)
class LexiconOptions:
    """The knobs of one token-level CTC search (torchaudio's ``ctc_decoder`` arguments). A bad value is a
    TypeError / ValueError naming the field."""

    # hypotheses kept after each frame (1 to MAX_BEAM_WIDTH, 100,000: the search sets aside room for them)
    beam_size: int = 50
    # tokens tried per frame (the frame's best); 0: all of them
    beam_size_token: int = 0
    # candidates scoring more than this below the frame's best are dropped
    beam_threshold: float = 50.0
    # weight of the language model's scores
    lm_weight: float = 2.0
    # added for each word ending (a lexicon word)
    word_score: float = 0.0
    # added for each unknown word (a token sequence off the lexicon); -inf: no unknown words
    unk_score: float = -math.inf
    # added for each silence token
    sil_score: float = 0.0
    # merge candidates in the same state by log-sum of their scores (False: keep the max)
    log_add: bool = False
    # hypotheses returned per utterance, best first
    nbest: int = 1

    def __post_init__(self) -> None:
        """Check every field (see :mod:`beamkit._checks`)."""
        check_int("beam_size", self.beam_size, least=1, most=MAX_BEAM_WIDTH)
        check_int("beam_size_token", self.beam_size_token, least=0)
        for name in ("beam_threshold", "lm_weight", "word_score", "sil_score"):
            check_float(name, getattr(self, name))
        check_float("unk_score", self.unk_score, minus_inf=True)
        check_bool("log_add", self.log_add)
        check_int("nbest", self.nbest, least=1)


class LexiconResult(NamedTuple):
    """One final hypothesis: its token and word per frame (index 0: the start, 1 .. T: the frames, T + 1: the
    end; -1 where no word ends) and its scores."""

    tokens: list[int]  # shape: (T + 2,)
    words: list[int]  # shape: (T + 2,)
    score: float
    am_score: float
    lm_score: float
