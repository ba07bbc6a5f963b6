"""Token-level CTC beam search with word-level LM scoring (flashlight's algorithm, behind torchaudio's
``ctc_decoder``): with a lexicon trie the words are those of the lexicon (plus an unknown word where allowed), the
LM scores each word as it ends and the trie's look-ahead scores partial words; without a lexicon any token
sequence is allowed and the LM scores tokens.

Each frame extends every hypothesis by the frame's ``beam_size_token`` best tokens, drops candidates scoring more
than ``beam_threshold`` below the best, merges candidates in the same state (same LM state, trie node, last token
and blank flag: by max or, with ``log_add``, by log-sum) and keeps the ``beam_size`` best. Scores are float64 sums
of the float32 emissions and the LM's float32 scores, in flashlight's order of operations, so they match it to
the bit.

:class:`LexiconSearch` decodes incrementally (:meth:`~LexiconSearch.begin`, :meth:`~LexiconSearch.step` on
``(frames, tokens)`` float32 arrays, :meth:`~LexiconSearch.end`, :meth:`~LexiconSearch.results`). Language models
follow the :class:`~beamkit.ctc.lexicon.lm.WordLM` protocol (:mod:`beamkit.ctc.lexicon.lm`).
The frame loop is :mod:`beamkit.ctc.lexicon.kernel`, driven by :mod:`beamkit.ctc.lexicon.compiled`: compiled by
numba where it is installed, else the same functions run as plain Python (same results, slower). The tests check
it against an independent interpreted search (``tests/lexicon_oracle.py``).
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from ..jit import COMPILED, warn_if_interpreted
from .compiled import CompiledSearch
from .lm import WordLM
from .options import LexiconOptions, LexiconResult
from .trie import LexiconTrie


class LexiconSearch:
    """The search over one utterance at a time (``begin``, ``step`` any number of times, ``end``, ``results``),
    with a lexicon trie (``trie``) or lexicon-free (``trie=None``)."""

    def __init__(
        self,
        options: LexiconOptions,
        lm: WordLM,
        *,
        trie: LexiconTrie | None,
        sil: int,
        blank: int,
        unk: int = -1,
    ) -> None:
        """A search with these options and LM; ``sil`` / ``blank`` are token ids, ``unk`` the unknown word's id.
        The arrays it works in are made here, once: later utterances reuse them."""
        self.options = options
        self.lm = lm
        self.trie = trie
        self.sil = sil
        self.blank = blank
        self.unk = unk
        self.frames = 0
        self.started = False  # begin() was called: step() and end() need an utterance
        self._run = CompiledSearch(self)

    def begin(self) -> None:
        """Start an utterance: one hypothesis at the LM's sentence start, on the silence token."""
        self.started = True
        self.frames = 0
        warn_if_interpreted()
        self._run.begin()

    def step(self, emissions: np.ndarray) -> None:
        """Decode more frames: ``emissions`` float32 of shape ``(frames, tokens)``."""
        if not self.started:
            raise RuntimeError("decode_step before decode_begin: start an utterance with decode_begin() first")
        # shape: (T, N)
        with _quiet():
            self._run.step(emissions)
        self.frames += emissions.shape[0]

    def end(self) -> None:
        """End the utterance: the LM's end-of-sentence score (with a lexicon, only hypotheses at a word boundary
        finish, unless none is), then the final hypotheses, best first."""
        if not self.started:
            raise RuntimeError("decode_end before decode_begin: start an utterance with decode_begin() first")
        with _quiet():
            self._run.end()

    def results(self, limit: int | None = None) -> list[LexiconResult]:
        """The final hypotheses (after :meth:`end`; before it, an empty list), best first; ``limit``: only the
        first ones (the others' paths are not read back)."""
        return self._run.results(limit)

    def paths(self, limit: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, float]]:
        """The first ``limit`` final hypotheses (after :meth:`end`; before it, an empty list), best first, read as
        torchaudio reads a path: per hypothesis the tokens (repeats collapsed, blanks dropped), the step of
        each (int32; 0: the start, frame t: t + 1), the ids of the words ending, and the score."""
        return self._run.paths(limit, self.blank)


def _quiet() -> nullcontext[None] | np.errstate:
    """Interpreted, numpy warns when the tables' 64-bit hashes wrap around (they are meant to); compiled code does
    not check."""
    return nullcontext() if COMPILED else np.errstate(over="ignore")
