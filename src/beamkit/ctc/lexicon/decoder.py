"""The lexicon decoder: :class:`LexiconDecoder` decodes CTC emissions (numpy, no torch) with flashlight's token-level
beam search, over a lexicon's words or lexicon-free, with an optional word (or token) language model; its knobs
are one frozen :class:`~beamkit.ctc.lexicon.options.LexiconOptions`. torchaudio's ``ctc_decoder`` drop-in
(:mod:`beamkit.ctc.compat.torchaudio`) is a shell over it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from beamkit._checks import check_int

from ..posteriors import as_real_array
from .lm import KenLMWords, NGramWords, ZeroLM
from .options import LexiconOptions
from .search import LexiconSearch
from .trie import UNK_WORD, build_trie, read_lexicon
from .words import Dictionary, Float32LM, check_words, search_lm_of, tokens_dictionary, word_dictionary


class LexiconHypothesis(NamedTuple):
    """One hypothesis of :class:`LexiconDecoder`."""

    tokens: np.ndarray  # shape: (L,) int64 token ids, repeats collapsed, blanks dropped (framed by silence)
    words: list[str]  # the words (with a lexicon; empty without one)
    score: float  # the total: emissions + lm_weight * LM + word, unknown-word and silence scores
    timesteps: np.ndarray  # shape: (L,) int32 the step of each token (0: the start, frame t: t + 1)


class LexiconDecoder:
    """Token-level CTC beam search over a lexicon (or lexicon-free) with an optional language model.

    ``tokens``: the tokens file (one token a line, in column order; entries on one line share an index) or list.
    ``lexicon``: a lexicon file (a word, then its spelling in tokens, one spelling a line) or None (any token
    sequence). ``lm``: a KenLM file (ARPA or binary, through the ``kenlm`` module), an object with ``start`` /
    ``score`` / ``finish`` (torchaudio's ``CTCDecoderLM`` protocol), or None. ``options``: a
    :class:`LexiconOptions` (default: torchaudio's defaults). ``lm_dict``: the LM's word list (one a line, in LM
    index order). ``blank``, ``sil``, ``unk_word``: the blank and silence tokens and the unknown word.
    Without a lexicon, ``word_score`` and ``unk_score`` do not apply (as in torchaudio).
    """

    def __init__(
        self,
        tokens: str | Path | Sequence[str],
        lexicon: str | Path | None = None,
        lm: Any = None,
        options: LexiconOptions | None = None,
        *,
        lm_dict: str | None = None,
        blank: str = "-",
        sil: str = "|",
        unk_word: str = UNK_WORD,
    ) -> None:
        """Read the tokens, the lexicon and the LM, and build the search (its arrays are reused by every call)."""
        if options is None:
            options = LexiconOptions()
        if not isinstance(options, LexiconOptions):
            raise TypeError(f"options must be a LexiconOptions, got {type(options).__name__}")
        if lm_dict is not None and not isinstance(lm_dict, (str, Path)):
            raise TypeError(f"lm_dict must be a file path or None, got {type(lm_dict).__name__}")
        tokens_dict = tokens_dictionary(tokens, blank, sil, unk_word)  # type: ignore[arg-type]
        words = read_lexicon(lexicon) if lexicon is not None else None
        word_dict = word_dictionary(words, lm, None if lm_dict is None else str(lm_dict), tokens_dict, unk_word)
        search_lm = search_lm_of(lm, word_dict)
        check_words(words, word_dict, unk_word)
        self._assemble(words, word_dict, tokens_dict, search_lm, options, (blank, sil, unk_word))

    @classmethod
    def from_parts(
        cls,
        lexicon: dict[str, list[list[str]]] | None,
        word_dict: Dictionary | None,
        tokens_dict: Dictionary,
        lm: Any,
        options: LexiconOptions,
        specials: tuple[str, str, str],
    ) -> LexiconDecoder:
        """A decoder from parts already read and checked (torchaudio's drop-in): ``specials`` is
        ``(blank, sil, unk_word)``."""
        decoder = cls.__new__(cls)
        decoder._assemble(lexicon, word_dict, tokens_dict, lm, options, specials)
        return decoder

    def _assemble(
        self,
        lexicon: dict[str, list[list[str]]] | None,
        word_dict: Dictionary | None,
        tokens_dict: Dictionary,
        lm: Any,
        options: LexiconOptions,
        specials: tuple[str, str, str],
    ) -> None:
        blank_token, sil_token, unk_word = specials
        if not lexicon:
            options = dataclasses.replace(options, word_score=0.0, unk_score=-math.inf)
        self.options = options
        self.word_dict = word_dict
        self.tokens_dict = tokens_dict
        self.blank = tokens_dict.get_index(blank_token)
        self.lm = lm
        silence = tokens_dict.get_index(sil_token)
        search_lm: Any = lm if isinstance(lm, (ZeroLM, KenLMWords, NGramWords)) else Float32LM(lm)
        trie, unk = None, -1
        if lexicon:
            assert word_dict is not None
            start = search_lm.start(False)
            scores = {word: search_lm.score(start, word_dict.get_index(word))[1] for word in lexicon}
            index = {word: word_dict.get_index(word) for word in lexicon}
            tokens = {tokens_dict.get_entry(i): i for i in range(tokens_dict.index_size())}
            tokens.update(tokens_dict._index)
            trie = build_trie(lexicon, tokens, index, scores, tokens_dict.index_size())
            unk = word_dict.get_index(unk_word)
        self.search = LexiconSearch(options, search_lm, trie=trie, sil=silence, blank=self.blank, unk=unk)

    # ------------------------------------------------------------------------------------------------------------
    def decode(self, emissions: Any, lengths: Any = None) -> list[list[LexiconHypothesis]]:
        """Decode a batch: emissions of shape ``(batch, frames, tokens)`` (or one ``(frames, tokens)`` matrix, a
        batch of one), read as float32 (log-probabilities or any scores), and optional valid lengths of shape
        ``(batch,)``. Returns per utterance its ``nbest`` best hypotheses, best first."""
        array = self.emissions(emissions)
        if array.ndim == 2:
            array = array[None]
        B, T, _ = array.shape
        valid = self.lengths(lengths, B, T)
        for b in range(B):
            self.check_values(array[b, : valid[b]])
        out = []
        for b in range(B):
            self.search.begin()
            self.search.step(array[b, : valid[b]])
            self.search.end()
            out.append(self.hypotheses())
        return out

    def begin(self) -> None:
        """Start an utterance for incremental decoding."""
        self.search.begin()

    def step(self, emissions: Any) -> None:
        """Decode more frames of the current utterance: a ``(frames, tokens)`` matrix."""
        array = self.emissions(emissions)
        if array.ndim != 2:
            raise ValueError(f"emissions must be a (frames, tokens) matrix here, got shape {array.shape}")
        self.check_values(array)
        self.search.step(array)

    def end(self) -> None:
        """Finish the current utterance (the LM's end-of-sentence score)."""
        self.search.end()

    def hypotheses(self) -> list[LexiconHypothesis]:
        """The ``nbest`` best hypotheses of the finished utterance, best first."""
        entry = self.word_dict.get_entry if self.word_dict is not None else None
        return [
            LexiconHypothesis(tokens, [entry(w) for w in words.tolist()] if entry else [], score, steps)
            for tokens, steps, words, score in self.search.paths(self.options.nbest)
        ]

    def idxs_to_tokens(self, idxs: Any) -> list[str]:
        """The tokens of token ids."""
        return [self.tokens_dict.get_entry(int(i)) for i in idxs]

    # ------------------------------------------------------------------------------------------------------------
    def emissions(self, emissions: Any) -> np.ndarray:
        """``emissions`` as a C-contiguous float32 array of 2 or 3 dimensions with a column per token (or more)."""
        array = as_real_array(emissions, "emissions", keep_dtype=True)
        if array.ndim not in (2, 3):
            raise ValueError(f"emissions must be (frames, tokens) or (batch, frames, tokens), got shape {array.shape}")
        self.check_width(array.shape[-1])
        return np.ascontiguousarray(array, dtype=np.float32)

    def check_width(self, n: int) -> None:
        """Emissions need at least one column per token (fewer would leave tokens unscored). Wider emissions are
        decoded over all their columns, as torchaudio decodes them: with a lexicon only the lexicon's tokens can
        be emitted; lexicon-free a column past the tokens is a token without a name (``idxs_to_tokens`` refuses
        it) and, with a language model over the tokens, its word (past the last one: a ValueError)."""
        if n < self.tokens_dict.index_size():
            raise ValueError(
                f"emissions must have at least a column per token ({self.tokens_dict.index_size()}), got {n} columns"
            )

    @staticmethod
    def check_values(array: np.ndarray) -> None:
        """No NaN among the frames decoded (every comparison of the search with a NaN is false)."""
        if np.isnan(array).any():
            raise ValueError("emissions hold NaN: check the acoustic model's output")

    @staticmethod
    def lengths(lengths: Any, batch: int, frames: int) -> list[int]:
        """Each utterance's valid frames (all of them when ``lengths`` is None), checked."""
        if lengths is None:
            return [frames] * batch
        valid = np.asarray(lengths).reshape(-1).tolist()
        if len(valid) != batch:
            raise ValueError(f"lengths must hold one length per utterance ({batch}), got {len(valid)}")
        return [check_int("lengths", n, least=0, most=frames) for n in valid]
