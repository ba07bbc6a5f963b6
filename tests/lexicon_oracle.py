"""The lexicon search (flashlight's algorithm, :mod:`beamkit.ctc.lexicon`) written as plain Python, one
hypothesis object per candidate and heaps for the beam cut: the oracle the compiled frame loop is checked
against (``tests/test_ctc_torchaudio.py``). It was the library's fallback before the compiled loop learned to run
interpreted; it stays here, independent of the arrays and tables the library's loop uses."""

from __future__ import annotations

import heapq
import math
from typing import Any, NamedTuple

import numpy as np

from beamkit.ctc.lexicon.lm import WordLM
from beamkit.ctc.lexicon.options import LexiconOptions, LexiconResult
from beamkit.ctc.lexicon.trie import LexiconTrie, TrieNode, f32


class Hyp(NamedTuple):
    """One hypothesis at one frame (a node of the search's back-pointer tree)."""

    score: float  # total: emissions + lm_weight * LM + word / unk / sil scores
    lm_state: Any  # the LM state (its identity is part of the hypothesis state)
    lex: TrieNode | None  # the trie node of the partial word (None without a lexicon)
    parent: Hyp | None  # the hypothesis one frame earlier
    token: int  # the token of this frame (the silence token at the start and the end)
    word: int  # the word ending at this frame, -1 if none
    prev_blank: bool  # this frame's token is the blank
    am_score: float  # the emissions' sum
    lm_score: float  # the LM's sum (unweighted; with a lexicon, look-ahead scores included)


class InterpretedLexiconSearch:
    """The lexicon search as plain Python, one hypothesis object per candidate (the oracle): the search over one
    utterance at a time (``begin``, ``step`` any number of times, ``end``, ``results``),
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
        """A search with these options and LM; ``sil`` / ``blank`` are token ids, ``unk`` the unknown word's id."""
        self.options = options
        self.lm = lm
        self.trie = trie
        self.sil = sil
        self.blank = blank
        self.unk = unk
        self.frames = 0
        self.started = False  # begin() was called: step() and end() need an utterance
        self._beam: list[Hyp] = []
        self._final: list[Hyp] | None = None

    # ------------------------------------------------------------------------------------------------------------
    def begin(self) -> None:
        """Start an utterance: one hypothesis at the LM's sentence start, on the silence token."""
        self.started = True
        root = self.trie.root if self.trie is not None else None
        self._beam = [Hyp(0.0, self.lm.start(False), root, None, self.sil, -1, False, 0.0, 0.0)]
        self._final = None
        self.frames = 0

    def step(self, emissions: np.ndarray) -> None:
        """Decode more frames: ``emissions`` float32 of shape ``(frames, tokens)``."""
        # shape: (T, N)
        T, N = emissions.shape
        if not self.started:
            raise RuntimeError("decode_step before decode_begin: start an utterance with decode_begin() first")
        k = self.options.beam_size_token or N
        for t in range(T):
            row = emissions[t]
            if N > k:
                order = np.argsort(-row, kind="stable")[:k].tolist()
            else:
                order = list(range(N))
            values = row.tolist()
            tried = [(n, values[n]) for n in order]
            if self.trie is None:
                candidates, best = self._free_candidates(tried, values)
            else:
                candidates, best = self._lexicon_candidates(tried, values)
            self._beam = self._store(candidates, best, sort=False)
        self.frames += T

    def end(self) -> None:
        """End the utterance: the LM's end-of-sentence score (with a lexicon, only hypotheses at a word boundary
        finish, unless none is), then the final hypotheses, best first."""
        if not self.started:
            raise RuntimeError("decode_end before decode_begin: start an utterance with decode_begin() first")
        w = self.options.lm_weight
        thr = self.options.beam_threshold
        root = self.trie.root if self.trie is not None else None
        nice = self.trie is not None and any(h.lex is root for h in self._beam)
        best = -math.inf
        candidates: list[Hyp] = []
        for prev in self._beam:
            if nice and prev.lex is not root:
                continue
            state, s = self.lm.finish(prev.lm_state)
            score = prev.score + w * s
            if score >= best:
                best = score
            if score >= best - thr:
                candidates.append(
                    Hyp(score, state, prev.lex, prev, self.sil, -1, False, prev.am_score, prev.lm_score + s)
                )
        self._final = self._store(candidates, best, sort=True)
        self.frames += 1

    def results(self) -> list[LexiconResult]:
        """The final hypotheses (after :meth:`end`; before it, an empty list), best first."""
        if self._final is None:
            return []
        out = []
        for hyp in self._final:
            tokens: list[int] = []
            words: list[int] = []
            node: Hyp | None = hyp
            while node is not None:
                tokens.append(node.token)
                words.append(node.word)
                node = node.parent
            tokens.reverse()
            words.reverse()
            out.append(LexiconResult(tokens, words, hyp.score, hyp.am_score, hyp.lm_score))
        return out

    # ------------------------------------------------------------------------------------------------------------
    def _free_candidates(self, tried: list[tuple[int, float]], values: list[float]) -> tuple[list[Hyp], float]:
        """Every hypothesis extended by every tried token (lexicon-free): a new token is scored by the LM."""
        w = self.options.lm_weight
        thr = self.options.beam_threshold
        sil_score = self.options.sil_score
        sil, blank, lm = self.sil, self.blank, self.lm
        best = -math.inf
        out: list[Hyp] = []
        add = out.append
        for prev in self._beam:
            prev_token, prev_blank, pscore = prev.token, prev.prev_blank, prev.score
            for n, e in tried:
                score = pscore + e
                if n == sil:
                    score += sil_score
                if n != blank and (n != prev_token or prev_blank):
                    state, s = lm.score(prev.lm_state, n)
                    total = score + w * s
                    if total >= best:
                        best = total
                    if total >= best - thr:
                        add(Hyp(total, state, None, prev, n, -1, False, prev.am_score + e, prev.lm_score + s))
                else:
                    if score >= best:
                        best = score
                    if score >= best - thr:
                        add(Hyp(score, prev.lm_state, None, prev, n, -1, n == blank, prev.am_score + e, prev.lm_score))
        return out, best

    def _lexicon_candidates(self, tried: list[tuple[int, float]], values: list[float]) -> tuple[list[Hyp], float]:
        """Every hypothesis extended along the trie (a word ends where the node holds words; an unknown word where
        it holds none and unknown words are allowed), kept on its node (repeat, or silence at the root), or by
        the blank."""
        o = self.options
        w, thr, sil_score, word_score, unk_score = o.lm_weight, o.beam_threshold, o.sil_score, o.word_score, o.unk_score
        allow_unk = unk_score > -math.inf
        sil, blank, unk, lm = self.sil, self.blank, self.unk, self.lm
        assert self.trie is not None
        root = self.trie.root
        best = -math.inf
        out: list[Hyp] = []
        add = out.append
        for prev in self._beam:
            prev_lex = prev.lex
            assert prev_lex is not None
            prev_token, pscore, pam, plm = prev.token, prev.score, prev.am_score, prev.lm_score
            at_root = prev_lex is root
            lex_max = 0.0 if at_root else prev_lex.max_score
            children = prev_lex.children
            # (1) the trie's children
            for n, e in tried:
                lex = children.get(n)
                if lex is None:
                    continue
                score = pscore + e
                if n == sil:
                    score += sil_score
                if prev.prev_blank or n != prev_token:
                    if lex.children:
                        s = f32(lex.max_score - lex_max)
                        total = score + w * s
                        if total >= best:
                            best = total
                        if total >= best - thr:
                            add(Hyp(total, prev.lm_state, lex, prev, n, -1, False, pam + e, plm + s))
                for label in lex.words:
                    if at_root and prev_token == n:
                        continue  # a one-token word repeated without a blank between is one word, not two
                    state, s = lm.score(prev.lm_state, label)
                    s = f32(s - lex_max)
                    total = score + w * s + word_score
                    if total >= best:
                        best = total
                    if total >= best - thr:
                        add(Hyp(total, state, root, prev, n, label, False, pam + e, plm + s))
                if not lex.words and allow_unk:
                    state, s = lm.score(prev.lm_state, unk)
                    s = f32(s - lex_max)
                    total = score + w * s + unk_score
                    if total >= best:
                        best = total
                    if total >= best - thr:
                        add(Hyp(total, state, root, prev, n, unk, False, pam + e, plm + s))
            # (2) the same node: the token repeated (or silence between words)
            if not prev.prev_blank or at_root:
                n = sil if at_root else prev_token
                e = values[n]
                score = pscore + e
                if n == sil:
                    score += sil_score
                if score >= best:
                    best = score
                if score >= best - thr:
                    add(Hyp(score, prev.lm_state, prev_lex, prev, n, -1, False, pam + e, plm))
            # (3) the blank
            e = values[blank]
            score = pscore + e
            if score >= best:
                best = score
            if score >= best - thr:
                add(Hyp(score, prev.lm_state, prev_lex, prev, blank, -1, True, pam + e, plm))
        return out, best

    def _store(self, candidates: list[Hyp], best: float, *, sort: bool) -> list[Hyp]:
        """The candidates within the threshold of the best, merged by state (max, or log-sum with ``log_add``),
        the ``beam_size`` best of them (sorted best first when ``sort``)."""
        floor = best - self.options.beam_threshold
        groups: dict[tuple[int, int, int, bool], list[Hyp]] = {}
        for c in candidates:
            if c.score >= floor:
                key = (id(c.lm_state), id(c.lex), c.token, c.prev_blank)
                group = groups.get(key)
                if group is None:
                    groups[key] = [c]
                else:
                    group.append(c)
        merged: list[Hyp] = []
        log_add = self.options.log_add
        for group in groups.values():
            if len(group) == 1:
                merged.append(group[0])
                continue
            group.sort(key=_score, reverse=True)
            top = group[0]
            acc = top.score
            for other in group[1:]:
                s = other.score
                hi, lo = (acc, s) if acc >= s else (s, acc)
                acc = hi + math.log1p(math.exp(lo - hi)) if log_add else hi
            merged.append(top._replace(score=acc))
        size = self.options.beam_size
        if sort:
            merged.sort(key=_score, reverse=True)
            return merged[:size]
        if len(merged) > size:
            return heapq.nlargest(size, merged, key=_score)
        return merged


def _score(hyp: Hyp) -> float:
    return hyp.score


def oracle_of(search: Any) -> InterpretedLexiconSearch:
    """An interpreted search with ``search``'s options, LM, trie and special ids."""
    return InterpretedLexiconSearch(
        search.options, search.lm, trie=search.trie, sil=search.sil, blank=search.blank, unk=search.unk
    )
