"""The language models the lexicon search asks (torchaudio's ``CTCDecoderLM`` protocol, :class:`WordLM`): the
start state, the next state and its score for a word (lexicon) or token (lexicon-free) index, and the
end-of-sentence state and score, over :class:`LMState` objects whose identity is the hypothesis state.
:class:`ZeroLM` (no LM), :class:`NGramWords` (an ARPA file compiled into arrays the search reads inside its
compiled loop, :mod:`beamkit.ctc.ngram`) and :class:`KenLMWords` (a KenLM binary file, through ``kenlm``) are
here."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from ..ngram import CompiledNGram
from .trie import f32


class LMState:
    """A language model state: a node of the tree of histories the search has asked about. ``child(index)``
    returns (creating it once) the state after one more word (token) ``index``; two hypotheses are in the same
    LM state only when they hold the same state object."""

    def __init__(self) -> None:
        """A state with no children yet."""
        self.children: dict[int, Any] = {}

    def child(self, usr_index: int) -> Any:
        """The state after ``usr_index``, created on first use (as an instance of this state's class)."""
        state = self.children.get(usr_index)
        if state is None:
            state = self.children[usr_index] = type(self)()
        return state

    def compare(self, state: LMState) -> int:
        """0 for the same state, else -1 or 1 (an arbitrary but fixed order)."""
        return 0 if self is state else (-1 if id(self) < id(state) else 1)


class WordLM(Protocol):
    """What the search asks of a language model (torchaudio's ``CTCDecoderLM``): the start state, the next state
    and its score (log10 for KenLM; any log scale works) for a word (lexicon) or token (lexicon-free) index, and
    the end-of-sentence state and score."""

    def start(self, start_with_nothing: bool) -> Any: ...

    def score(self, state: Any, usr_token_idx: int) -> tuple[Any, float]: ...

    def finish(self, state: Any) -> tuple[Any, float]: ...


class ZeroLM:
    """No language model: every score is 0; the state still follows the history (so only equal histories merge)."""

    def start(self, start_with_nothing: bool) -> LMState:
        """A fresh root state."""
        return LMState()

    def score(self, state: LMState, usr_token_idx: int) -> tuple[LMState, float]:
        """The child state, score 0."""
        return state.child(usr_token_idx), 0.0

    def finish(self, state: LMState) -> tuple[LMState, float]:
        """The same state, score 0."""
        return state, 0.0


class _IndexedWords:
    """What the two n-gram models share: index ``i`` is the LM word ``words[i]``; ``score`` and ``finish`` go
    through the model's ``_advance(state, key, word)`` (key -1: the end of sentence)."""

    words: list[str]

    def _advance(self, state: Any, key: int, word: str) -> tuple[Any, float]:
        raise NotImplementedError

    def score(self, state: Any, usr_token_idx: int) -> tuple[Any, float]:
        """The state after word ``usr_token_idx`` and its log10 probability."""
        if not 0 <= usr_token_idx < len(self.words):
            raise ValueError(f"word index {usr_token_idx} is out of range for the LM's {len(self.words)} words")
        return self._advance(state, usr_token_idx, self.words[usr_token_idx])

    def finish(self, state: Any) -> tuple[Any, float]:
        """The state after the end of sentence and its log10 probability."""
        return self._advance(state, -1, "</s>")


class _KenState(LMState):
    __slots__ = ("ken", "cached")

    def __init__(self) -> None:
        super().__init__()
        self.ken: Any = None
        self.cached: float | None = None


class KenLMWords(_IndexedWords):
    """A KenLM model (ARPA or binary, through the ``kenlm`` module) scoring word (or token) indices: index ``i``
    is the LM word ``words[i]`` (a word the model lacks is its ``<unk>``); scores are KenLM's log10 float32."""

    def __init__(self, model: Any, words: list[str]) -> None:
        """Wrap a loaded ``kenlm.Model`` with the index-to-word list."""
        import kenlm

        self._kenlm = kenlm
        self.model = model
        self.words = words

    def start(self, start_with_nothing: bool) -> _KenState:
        """A fresh state at the sentence start (or with no context)."""
        state = _KenState()
        state.ken = self._kenlm.State()
        if start_with_nothing:
            self.model.NullContextWrite(state.ken)
        else:
            self.model.BeginSentenceWrite(state.ken)
        return state

    def _advance(self, state: _KenState, key: int, word: str) -> tuple[_KenState, float]:
        child = state.child(key)
        if child.cached is None:
            child.ken = self._kenlm.State()
            child.cached = f32(self.model.BaseScore(state.ken, word, child.ken))
        return child, child.cached


class _NGramState(LMState):
    __slots__ = ("context", "cached")

    def __init__(self) -> None:
        super().__init__()
        self.context = 0
        self.cached: float | None = None


class NGramWords(_IndexedWords):
    """A compiled ARPA model (:class:`beamkit.ctc.ngram.CompiledNGram`) scoring word (or token) indices: index ``i``
    is the LM word ``words[i]`` (a word the model lacks is its ``<unk>``). The search reads its arrays inside the
    compiled loop; these methods give the same float32 scores in Python (for the lexicon's look-ahead scores)."""

    def __init__(self, model: CompiledNGram, words: list[str]) -> None:
        """The model with the index-to-word list."""
        self.model = model
        self.words = words
        self.word_ids = np.array([model.word_id(w) for w in words], dtype=np.int64)  # shape: (indices,)

    def start(self, start_with_nothing: bool) -> _NGramState:
        """A fresh state at the sentence start (or with no context)."""
        state = _NGramState()
        state.context = self.model.null_state() if start_with_nothing else self.model.begin_state()
        return state

    def _advance(self, state: _NGramState, key: int, word: str) -> tuple[_NGramState, float]:
        child = state.child(key)
        if child.cached is None:
            p, child.context = self.model.score(state.context, word)
            child.cached = f32(p)
        return child, child.cached
