"""A token-level n-gram language model as a numpy step function (for :func:`beamkit.fuse`).

The model is read by :class:`beamkit.lm.ArpaLM` (the project's one ARPA reader, KenLM's back-off semantics)
or built from a corpus by :func:`beamkit.lm.build_arpa` (interpolated modified Kneser-Ney). Each token id of
the decoder's vocabulary names an LM word (``vocab[i]``); ``</s>`` is the end of the sentence. The state is
one int64 context id per row (an array leaf, gathered by ``select_state``); the logits of a context are the
natural-log probabilities of every token, computed once per context and cached.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from beamkit import ops
from beamkit._checks import check_int

from .arpa import SPECIAL_WORDS, ArpaLM
from .kneser_ney import MAX_ORDER, build_arpa

LN10 = math.log(10.0)
FEW_KNOWN_TOKENS = 0.1  # below this share of the vocabulary's words known to the LM, NGramLM warns


class NGramLM:
    """A token-level n-gram LM: ``lm.step(state, y_prev) -> (log-probs [rows, V], state)``.

    ``source``: the path of an ARPA file, an :class:`beamkit.lm.ArpaLM`, or a corpus (an iterable of
    sentences, each a list of LM words or a whitespace-separated string) whose n-gram counts build an
    interpolated modified Kneser-Ney model of ``order``. ``vocab[i]`` is the LM word of token ``i`` (tokens
    whose word the LM lacks score as its ``<unk>``); ``</s>`` is scored as the end of the sentence. Feeding
    ``bos`` (default: the token named ``<s>``, if any) or any negative id starts a sentence. The logits are
    ``ln p(word | context)``; :func:`beamkit.fuse` renormalises them over the tokens.

    An LM that knows none of the vocabulary's words (``<s>``, ``</s>``, ``<unk>`` aside) is refused
    (ValueError): every token would score as its ``<unk>`` and fusing it would change nothing. When it knows
    fewer than a tenth of them (``FEW_KNOWN_TOKENS``) a UserWarning says how many.
    ``order`` (a corpus only): 1 to 20; ``bos``: a token id below ``len(vocab)``, or negative for none.
    """

    def __init__(self, source: Any, vocab: Sequence[str], *, order: int = 3, bos: int | None = None) -> None:
        if isinstance(vocab, str) or not all(isinstance(w, str) for w in vocab) or not vocab:
            raise TypeError("vocab must be a non-empty sequence of strings (the LM word of each token id)")
        self.lm = _load(source, order)
        self.vocab = list(vocab)
        _check_overlap(self.lm, self.vocab)
        if bos is None:
            bos = self.vocab.index("<s>") if "<s>" in self.vocab else -1
        self.bos = check_int("NGramLM bos", bos, most=len(self.vocab) - 1)
        self._ids: dict[tuple[int, ...], int] = {}  # LM context -> context id
        self._contexts: list[tuple[int, ...]] = []
        self._table = np.zeros((0, len(self.vocab)))  # shape: (contexts, V) ln p, filled lazily
        self._next = np.zeros((0, len(self.vocab)), dtype=np.int64)  # shape: (contexts, V) context after a token
        self._done = np.zeros(0, dtype=bool)
        self.begin = self._intern(self.lm.begin_state())

    @property
    def order(self) -> int:
        """The n-gram order."""
        return int(self.lm.order)

    def init_state(self, n: int) -> np.ndarray:
        """``n`` rows at the start of a sentence (after ``<s>``); ``n`` is an integer >= 0."""
        return np.full(check_int("NGramLM.init_state n", n, least=0), self.begin, dtype=np.int64)

    def __call__(self, state: Any, y_prev: Any) -> tuple[np.ndarray, np.ndarray]:
        """The step function: see :meth:`step`."""
        return self.step(state, y_prev)

    def step(self, state: Any, y_prev: Any) -> tuple[np.ndarray, np.ndarray]:
        """Advance each row's context by ``y_prev``; return ``ln p`` of every token ``[rows, V]`` and the state.

        ``state`` is what :meth:`init_state` or an earlier step returned (one context id per row); anything else
        raises TypeError / ValueError."""
        ctx = self._contexts_of(state)
        y = np.asarray(ops.to_numpy(y_prev), dtype=np.int64).reshape(-1)
        if ctx.shape != y.shape:
            raise ValueError(f"NGramLM.step: {ctx.shape[0]} state rows but {y.shape[0]} tokens")
        if (y >= len(self.vocab)).any():
            raise ValueError(f"NGramLM.step: token {int(y.max())} is outside the vocabulary of {len(self.vocab)}")
        start = (y < 0) | (y == self.bos)
        for c in np.unique(ctx[~start]).tolist():
            self._fill(c)
        new = np.where(start, self.begin, self._next[ctx, np.where(start, 0, y)])  # shape: (rows,)
        for c in np.unique(new).tolist():
            self._fill(c)
        return self._table[new], new  # shape: (rows, V)

    def _contexts_of(self, state: Any) -> np.ndarray:
        """``state`` as int64 context ids ``[rows]``, checked to be ids this model gave out."""
        raw = ops.to_numpy(state) if ops.is_array(state) else None
        if raw is None or raw.dtype.kind not in "iu" or raw.ndim != 1:
            what = f"{raw.dtype} array of shape {raw.shape}" if raw is not None else type(state).__name__
            raise TypeError(
                f"NGramLM.step: state must be a 1-D integer array of context ids (from init_state or an earlier "
                f"step), got {what}"
            )
        ctx = raw.astype(np.int64)
        bad = ctx[(ctx < 0) | (ctx >= len(self._contexts))]
        if bad.size:
            raise ValueError(
                f"NGramLM.step: state holds context id {int(bad[0])}, which this model never gave out (it has "
                f"{len(self._contexts)}); pass the state init_state or an earlier step returned"
            )
        return ctx

    def sentence_logprob(self, tokens: Sequence[int]) -> float:
        """Natural-log probability of a token sequence from the start of a sentence (an oracle for tests)."""
        state = self.lm.begin_state()
        total = 0.0
        for t in tokens:
            logp, state = self.lm.score(state, self.vocab[int(t)])
            total += logp * LN10
        return total

    def _intern(self, context: tuple[int, ...]) -> int:
        cid = self._ids.get(context)
        if cid is None:
            cid = self._ids[context] = len(self._contexts)
            self._contexts.append(context)
            if cid >= self._table.shape[0]:
                grow = max(16, 2 * self._table.shape[0])
                self._table = np.concatenate([self._table, np.zeros((grow, self._table.shape[1]))])
                self._next = np.concatenate([self._next, np.zeros((grow, self._next.shape[1]), dtype=np.int64)])
                self._done = np.concatenate([self._done, np.zeros(grow, dtype=bool)])
        return cid

    def _fill(self, cid: int) -> None:
        """Score every token after context ``cid`` once; remember where each token leads."""
        if self._done[cid]:
            return
        context = self._contexts[cid]
        for v, word in enumerate(self.vocab):
            logp, after = self.lm.score(context, word)
            self._table[cid, v] = logp * LN10
            self._next[cid, v] = self._intern(after)
        self._done[cid] = True


def _check_overlap(lm: ArpaLM, vocab: list[str]) -> None:
    """Refuse an LM that knows none of ``vocab``'s words; warn when it knows few (see :class:`NGramLM`)."""
    words = {w for w in vocab if w not in SPECIAL_WORDS}
    if not words:
        return  # a vocabulary of sentence marks only: nothing to compare
    known = sum(1 for w in words if w in lm)
    example = ", ".join(repr(w) for w in sorted(words)[:3])
    if known == 0:
        raise ValueError(
            f"the language model knows none of the vocabulary's {len(words)} words (such as {example}): every "
            "token would score as its <unk> and the LM would change nothing; give an LM built over the same "
            "tokens as the decoder's vocabulary"
        )
    if known < FEW_KNOWN_TOKENS * len(words):
        warnings.warn(
            f"the language model knows only {known} of the vocabulary's {len(words)} words "
            f"({100 * known / len(words):.1f}%); the others score as its <unk>: check that the LM was built over "
            "the decoder's tokens",
            UserWarning,
            stacklevel=3,
        )


def _load(source: Any, order: int) -> ArpaLM:
    """An :class:`ArpaLM` from a path, an ArpaLM, or a corpus of sentences (Kneser-Ney of ``order``)."""
    if isinstance(source, ArpaLM):
        return source
    if isinstance(source, str) and not os.path.exists(source) and len(source.split()) > 1:
        raise ValueError(
            f"NGramLM: source {source[:40]!r} names no file: an ARPA model is a path, a corpus a list of sentences "
            f"(NGramLM([{source[:20]!r}, ...], vocab))"
        )
    if isinstance(source, (str, os.PathLike)):
        return ArpaLM.from_file(source)
    if isinstance(source, Iterable):
        corpus = list(source)
        for i, sentence in enumerate(corpus):
            if not isinstance(sentence, str) and not (
                isinstance(sentence, Sequence) and all(isinstance(w, str) for w in sentence)
            ):
                raise TypeError(
                    "NGramLM: a corpus is a sequence of sentences, each a string or a list of word strings; "
                    f"sentence {i} is {sentence!r}"
                )
        check_int("NGramLM order", order, least=1, most=MAX_ORDER)
        return ArpaLM.from_lines(build_arpa(corpus, order=order).splitlines())
    raise TypeError(f"NGramLM needs an ARPA path, an ArpaLM or a corpus of sentences, got {type(source).__name__}")
