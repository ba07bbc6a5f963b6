"""Every rule of LM and hotword fusion in the CTC search, in one place (pyctcdecode's rules).

A prefix's fused score is the score of its completed words plus the score of its partial word:

* completed word ``w`` after LM context ``h``: ``alpha * ln(10) * (log10 p(w | h) + unk) + beta`` (``unk`` is
  the unknown-word offset for a word outside the unigram list), see
  :meth:`~beamkit.ctc.lm.LanguageModelFusion.score_words`; plus ``hotword_weight`` when ``w`` is a hotword;
* partial word ``s``: ``hotword_weight * len(s) / len(shortest hotword starting with s)`` when a hotword
  starts with ``s``; else, with an LM, the unknown-word offset (scaled by ``len(s) / 6`` beyond 6
  characters) when no unigram starts with ``s``; else 0;
* end of utterance: the partial word is scored as a completed word (an empty one too with
  ``pyctcdecode_compat``), then ``alpha * ln(10) * log10 p(</s> | h)``.

The compiled search reads these rules from arrays (:class:`Static`). An ARPA model (a file, or a model loaded
from one) is read from its compiled arrays (:mod:`beamkit.ctc.prefix.lmarrays`): the search never leaves compiled
code for it. Any other model (a KenLM binary file, a user's model) is read from a table of (LM context, word)
pairs already scored (:class:`LMCache`, kept across calls): a word whose pair is not in the table is a *pending*
query, the search stops, :meth:`Fusion.resolve` asks the LM (in Python, one batch), and the search takes up the
frame again.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np

from ..jit import njit, njit_inline, records
from ..lm import AVG_TOKEN_LEN, LanguageModelFusion
from ..tables import SALT, home_slot, next_slot
from ..vocab import Vocabulary
from .chartrie import CharTrie, walk
from .lmarrays import WordArrays, no_words
from .lmarrays import word_score as array_word_score

# Static.flags
SCORED, HAS_LM, HAS_HOT, HAS_UNI = 0, 1, 2, 3
# Static.floats
UNK, HOT_WEIGHT = 0, 1

WORD = np.dtype(
    [
        ("sid", np.int64),  # LM context id (-1: an empty slot)
        ("whash", np.uint64),  # the word's hash
        ("nsid", np.int64),  # the context id after the word
        ("delta", np.float64),  # the word's fused LM score
    ]
)
PENDING = np.dtype([("sid", np.int64), ("node", np.int64), ("whash", np.uint64)])  # node: the word is its partial word
_EMPTY_I = np.zeros(0, dtype=np.int64)
_EMPTY_F = np.zeros(0, dtype=np.float64)
_EMPTY_B = np.zeros(0, dtype=np.bool_)
MAX_CACHED_STATES = 1 << 20  # an LM cache that grows past this many contexts starts afresh


class Static(NamedTuple):
    """What the compiled search reads about labels and fusion (fixed for one search)."""

    starts_word: np.ndarray  # shape: (V,) bool: the label starts a word (the delimiter, a BPE "▁" piece)
    loop_tok: np.ndarray  # shape: (V,) bool: leaves a prefix without a partial word unchanged
    piece_len: np.ndarray  # shape: (V,) int64: characters the label adds to the partial word
    piece_chars: np.ndarray  # shape: (V, L) int64: those characters as alphabet codes (-1: padding)
    piece_codes: np.ndarray  # shape: (V, L) uint64: the codes as hash inputs
    uni_table: np.ndarray  # unigram trie (see beamkit.ctc.prefix.chartrie): dense table, or empty
    uni_keys: np.ndarray  # ... or sorted keys and values
    uni_values: np.ndarray
    hot_table: np.ndarray  # hotword trie, the same way
    hot_keys: np.ndarray
    hot_values: np.ndarray
    hot_min_len: np.ndarray  # shape: (states,) float64: shortest hotword below each state
    hot_is_word: np.ndarray  # shape: (states,) bool: a hotword ends there
    flags: np.ndarray  # shape: (4,) bool: SCORED (LM or hotwords), HAS_LM, HAS_HOT, HAS_UNI
    sizes: np.ndarray  # shape: (4,) int64: unigram trie width and alphabet size, hotword trie the same
    floats: np.ndarray  # shape: (2,) float64: unknown-word offset, hotword weight
    lm: WordArrays  # a compiled ARPA model (lm.flags[0]), else unused


@njit
def word_lookup(st: Static, wt: np.ndarray, sid: int, wh: np.uint64) -> int:
    """Slot of (context ``sid``, word hash ``wh``) in the word table, or -1 when it is not there."""
    mask = len(wt) - 1
    s = home_slot(wh ^ (np.uint64(sid) * SALT), mask)
    while wt[s].sid != -1:
        if wt[s].sid == sid and wt[s].whash == wh:
            return s
        s = next_slot(s, mask)
    return -1


@njit
def word_store(wt: np.ndarray, sid: int, wh: np.uint64, nsid: int, delta: float) -> None:
    """Put a scored (context, word) pair into the word table (which has a free slot)."""
    mask = len(wt) - 1
    s = home_slot(wh ^ (np.uint64(sid) * SALT), mask)
    while wt[s].sid != -1:
        if wt[s].sid == sid and wt[s].whash == wh:
            return
        s = next_slot(s, mask)
    wt[s].sid = sid
    wt[s].whash = wh
    wt[s].nsid = nsid
    wt[s].delta = delta


@njit
def word_store_many(wt: np.ndarray, sids: np.ndarray, hashes: np.ndarray, nsid0: int, deltas: np.ndarray) -> None:
    """:func:`word_store` of each pair ``(sids[j], hashes[j])``, its new context being ``nsid0 + j``."""
    for j in range(len(sids)):
        word_store(wt, sids[j], hashes[j], nsid0 + j, deltas[j])


@njit
def pending_words(
    nodes: np.ndarray, starts_word: np.ndarray, pend: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (context, word) pairs of the word queries in ``pend`` (:data:`PENDING` records; an
    end-of-utterance query, node -1, is skipped), first occurrence first, and the labels that spell each word
    (its partial word, last label first). Returns ``(sids, hashes, labels, offsets)``: word ``j`` is
    ``labels[offsets[j]:offsets[j + 1]]`` read backwards."""
    n = len(pend)
    sids = np.empty(n, dtype=np.int64)
    hashes = np.empty(n, dtype=np.uint64)
    firsts = np.empty(n, dtype=np.int64)
    k = 0
    for i in range(n):
        if pend[i].node < 0:
            continue
        seen = False
        for j in range(k):  # a handful of queries per stop: a scan beats a hash table
            if sids[j] == pend[i].sid and hashes[j] == pend[i].whash:
                seen = True
                break
        if not seen:
            sids[k] = pend[i].sid
            hashes[k] = pend[i].whash
            firsts[k] = pend[i].node
            k += 1
    offsets = np.zeros(k + 1, dtype=np.int64)
    for j in range(k):
        d = 0
        x = firsts[j]
        while x > 0:
            d += 1
            if starts_word[nodes[x].last]:
                break
            x = nodes[x].parent
        offsets[j + 1] = offsets[j] + d
    labels = np.empty(offsets[k], dtype=np.int64)
    for j in range(k):
        x = firsts[j]
        for q in range(offsets[j], offsets[j + 1]):
            labels[q] = nodes[x].last
            x = nodes[x].parent
    return sids[:k], hashes[:k], labels, offsets


@njit
def word_rehash(old: np.ndarray, new: np.ndarray) -> None:
    """Move every pair of ``old`` into the (larger, empty) table ``new``."""
    for s in range(len(old)):
        if old[s].sid != -1:
            word_store(new, old[s].sid, old[s].whash, old[s].nsid, old[s].delta)


@njit_inline
def complete_word(st: Static, wt: np.ndarray, src_hot: int, wh: np.uint64, n: Any) -> bool:
    """Score the word of hash ``wh`` the new node ``n`` completes (``n.tscore`` and ``n.sid`` hold the
    source's): the hotword bonus (``src_hot``: the hotword state of the word), then the LM score (a compiled
    model's, or the one the word table holds). Returns False (``n.sid`` = -1) when the LM has not scored the
    pair yet."""
    if st.flags[HAS_HOT] and src_hot >= 0 and st.hot_is_word[src_hot]:
        n.tscore = n.tscore + st.floats[HOT_WEIGHT]
    if st.flags[HAS_LM] and st.lm.flags[0]:
        delta, after = array_word_score(st.lm, n.sid, wh)
        n.sid = after
        n.tscore = n.tscore + delta
    elif st.flags[HAS_LM]:
        slot = word_lookup(st, wt, n.sid, wh)
        if slot < 0:
            n.sid = -1
            return False
        n.sid = wt[slot].nsid
        n.tscore = n.tscore + wt[slot].delta
    return True


@njit_inline
def partial_score(st: Static, n: Any, uni: int, hot: int, t: int) -> None:
    """Walk the partial word's tries by label ``t``'s characters from states ``uni`` / ``hot`` and set
    ``n.score`` = ``n.tscore`` + the partial word's score."""
    plen = n.plen
    partial = 0.0
    n.uni = -1
    if st.flags[HAS_LM]:
        if st.flags[HAS_UNI]:
            for j in range(st.piece_chars.shape[1]):
                uni = walk(
                    st.uni_table, st.sizes[0], st.uni_keys, st.uni_values, st.sizes[1], uni, st.piece_chars[t, j]
                )
            n.uni = uni
        if plen > 0 and n.uni < 0:
            scale = plen / AVG_TOKEN_LEN if plen > AVG_TOKEN_LEN else 1.0
            partial = st.floats[UNK] * scale
    n.hot = 0
    if st.flags[HAS_HOT]:
        for j in range(st.piece_chars.shape[1]):
            hot = walk(st.hot_table, st.sizes[2], st.hot_keys, st.hot_values, st.sizes[3], hot, st.piece_chars[t, j])
        n.hot = hot
        if plen > 0 and hot >= 0:
            partial = st.floats[HOT_WEIGHT] * plen / st.hot_min_len[hot]
    n.score = n.tscore + partial


class SharedLock:
    """Many readers (compiled searches reading the word table) or one writer (adding pairs to it)."""

    def __init__(self) -> None:
        """An unlocked lock."""
        self._cond = threading.Condition()
        self._readers = 0

    @contextmanager
    def shared(self) -> Iterator[None]:
        """Hold the lock with other readers."""
        with self._cond:
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the lock alone."""
        with self._cond:
            while self._readers:
                self._cond.wait()
            yield


class LMCache:
    """Scored (LM context, word) pairs and end-of-utterance scores of one fused LM over one alphabet, kept
    across searches (the LM is deterministic): contexts are ids into :attr:`states`."""

    def __init__(self, lm: LanguageModelFusion, trie: CharTrie | None) -> None:
        """An empty cache holding the start context (id 0)."""
        self.lm = lm
        self.trie = trie
        self.states: list[Any] = [lm.start_state()]
        self.table = records(1 << 12, WORD)
        self.table["sid"] = -1
        self.count = 0
        self.eos = np.full(1 << 10, np.nan)  # shape: (contexts,) end-of-utterance scores (NaN: not asked yet)
        self.lock = SharedLock()
        self.arrays: WordArrays | None = None  # a compiled ARPA model: contexts are its states, not ids of states
        self.model: Any = None  # ... and its CompiledNGram
        self._replayed: dict[int, Any] = {}

    def state_of(self, sid: int) -> Any:
        """The LM's own state object of context ``sid`` (a compiled model's state: its context words scored by
        the LM from the empty context, once per state)."""
        if self.arrays is None:
            return self.states[sid]
        got = self._replayed.get(sid)
        if got is None:
            model = self.lm.model
            got = model.null_state()
            for word in self.model.context_words(sid):
                got = model.score(got, word)[1]
            self._replayed[sid] = got
        return got

    def store(self, sids: np.ndarray, hashes: np.ndarray, words: Sequence[str]) -> None:
        """Score the distinct new (context, word) pairs (``sids``: int64, ``hashes``: uint64) with the LM in
        one batch and put them in the table (while no search reads it)."""
        with self.lock.exclusive():
            self._store(sids, hashes, words)

    def _store(self, sids: np.ndarray, hashes: np.ndarray, words: Sequence[str]) -> None:
        states = self.states
        deltas, new_states = self.lm.score_words([states[s] for s in sids.tolist()], list(words))
        if 2 * (self.count + len(sids)) > len(self.table):
            size = len(self.table)
            while 2 * (self.count + len(sids)) > size:
                size *= 4
            grown = records(size, WORD)
            grown["sid"] = -1
            word_rehash(self.table, grown)
            self.table = grown
        base = len(states)
        states.extend(new_states)
        word_store_many(self.table, sids, hashes, base, np.asarray(deltas, dtype=np.float64))
        self.count += len(sids)

    def eos_scores(self, sids: np.ndarray) -> np.ndarray:
        """End-of-utterance fused scores of the contexts ``sids`` (asked of the LM, alone, when missing)."""
        eos = self.eos  # scores only ever go from NaN to their value, and a grown array keeps them
        if len(eos) >= len(self.states):
            got = eos[sids]
            if not np.isnan(got).any():
                return got
        with self.lock.exclusive():
            return self._eos_scores(sids)

    def _eos_scores(self, sids: np.ndarray) -> np.ndarray:
        if len(self.eos) < len(self.states):
            grown = np.full(max(len(self.states), 2 * len(self.eos)), np.nan)
            grown[: len(self.eos)] = self.eos
            self.eos = grown
        got = self.eos[sids]
        if np.isnan(got).any():
            missing = np.unique(sids[np.isnan(got)])
            self.eos[missing] = self.lm.score_eos_many([self.states[s] for s in missing.tolist()])
            got = self.eos[sids]
        return got


def lm_cache_key(lm: LanguageModelFusion, alphabet_key: tuple[Any, ...]) -> tuple[Any, ...]:
    """What an :class:`LMCache` of ``lm`` over an alphabet (of key ``alphabet_key``) depends on: the alphabet, the
    model and the fusion weights (a cache whose key differs is made afresh)."""
    return (alphabet_key, id(lm.model), lm.alpha, lm.beta, lm.unk_score_offset, lm.score_boundary)


def fresh_lm_cache(lm: LanguageModelFusion, labels: LabelTables, old: LMCache | None, same_alphabet: bool) -> LMCache:
    """An empty :class:`LMCache` of ``lm`` over ``labels``' alphabet; the unigram trie of ``old`` (the cache it
    replaces) is reused when the alphabet is the same."""
    trie = None
    if old is not None and same_alphabet:
        trie = old.trie  # same alphabet: the unigram trie still holds
    elif lm.prefix_index is not None:
        trie = _unigram_trie(lm, labels.alphabet, labels.alphabet_key)
    return LMCache(lm, trie)


MAX_KEPT_TRIES = 8  # unigram tries kept by the process (the last ones built)
_TRIES: dict[tuple[Any, ...], CharTrie] = {}


def _unigram_trie(lm: LanguageModelFusion, alphabet: dict[str, int], alphabet_key: tuple[Any, ...]) -> CharTrie:
    """The character trie of ``lm``'s unigrams over ``alphabet``, built once per process for the same unigrams
    and alphabet (a fresh decoder over the same words does not build it again). A fusion made per call (the
    pyctcdecode drop-in's, with a start state) keeps it where its class says, ``_char_trie_cache`` on a
    longer-lived object, and finds it there again while the unigrams and the alphabet are the same."""
    keeps = hasattr(type(lm), "_char_trie_cache")
    held = getattr(lm, "_char_trie_cache", None) if keeps else None
    if held is not None and held[0] == alphabet_key and held[1] is lm.unigrams:
        return held[2]  # type: ignore[no-any-return]
    key = (alphabet_key, lm.unigrams)
    trie = _TRIES.get(key)
    if trie is None:  # read-only once built: shared by the decoders of this process with these unigrams
        trie = CharTrie(lm.unigrams, alphabet)
        if len(_TRIES) >= MAX_KEPT_TRIES:
            _TRIES.pop(next(iter(_TRIES)))
        _TRIES[key] = trie
    if keeps:
        lm._char_trie_cache = (alphabet_key, lm.unigrams, trie)  # type: ignore[attr-defined]
    return trie


def _trie_arrays(trie: CharTrie | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """(dense table or empty, keys, values, width, alphabet size) of a character trie."""
    if trie is None:
        return _EMPTY_I, _EMPTY_I, _EMPTY_I, 0, 0
    table = trie.table if trie.table is not None else _EMPTY_I
    return table, trie.keys, trie.values, trie.width, trie.alphabet_size


class LabelTables:
    """What the search needs to know about each label (built once per decoder, read-only after)."""

    def __init__(self, vocab: Vocabulary) -> None:
        """Split every label into the characters it adds to a partial word."""
        starts = vocab.starts_word
        # per-label pieces that extend the partial word
        self.clean = [
            (lab[1:] if vocab.is_bpe else "") if starts[i] else ("" if i == vocab.blank else lab)
            for i, lab in enumerate(vocab.labels)
        ]
        self.alphabet: dict[str, int] = {}
        for piece in self.clean:
            for ch in piece:
                self.alphabet.setdefault(ch, len(self.alphabet))
        width = max([len(p) for p in self.clean] + [1])
        self.piece_chars = np.full((vocab.size, width), -1, dtype=np.int64)  # shape: (V, L)
        for i, piece in enumerate(self.clean):
            for j, ch in enumerate(piece):
                self.piece_chars[i, j] = self.alphabet[ch]
        self.piece_len = np.array([len(p) for p in self.clean], dtype=np.int64)  # shape: (V,)
        self.starts_word = np.asarray(starts, dtype=np.bool_)  # shape: (V,)
        self.loop_tok = self.starts_word & (self.piece_len == 0)  # shape: (V,)
        self.piece_codes = (self.piece_chars + 1).astype(np.uint64) * SALT  # shape: (V, L)
        # text pieces per label (a word-starting label opens a new word)
        self.text_piece = [(" " + p if starts[i] else p) for i, p in enumerate(self.clean)]
        self.alphabet_key = tuple(sorted(self.alphabet.items()))


class Fusion:
    """The fusion side of one search: the :class:`Static` arrays, the LM cache, and the Python work the
    compiled search hands over (LM queries, end-of-utterance scores)."""

    def __init__(
        self, labels: LabelTables, cache: LMCache | None, hot_trie: CharTrie | None, hotword_weight: float
    ) -> None:
        """Gather the label tables, the LM cache (None without an LM) and the hotword trie (None without
        hotwords); a decoder keeps the last one for its next search (``beamkit.ctc.prefix.run.SearchCaches``)."""
        lm = cache.lm if cache is not None else None
        self.lm = lm
        self.clean = labels.clean
        self.starts_word = labels.starts_word
        self.text_piece = labels.text_piece
        self.cache = cache
        uni = _trie_arrays(cache.trie if cache is not None else None)
        hot = _trie_arrays(hot_trie)
        self.static = Static(
            starts_word=labels.starts_word,
            loop_tok=labels.loop_tok,
            piece_len=labels.piece_len,
            piece_chars=labels.piece_chars,
            piece_codes=labels.piece_codes,
            uni_table=uni[0],
            uni_keys=uni[1],
            uni_values=uni[2],
            hot_table=hot[0],
            hot_keys=hot[1],
            hot_values=hot[2],
            hot_min_len=hot_trie.min_len if hot_trie is not None else _EMPTY_F,
            hot_is_word=hot_trie.is_word if hot_trie is not None else _EMPTY_B,
            flags=np.array([lm is not None or hot_trie is not None, lm is not None, hot_trie is not None, uni[3] > 0]),
            sizes=np.array([uni[3], uni[4], hot[3], hot[4]], dtype=np.int64),
            floats=np.array([lm.unk_score_offset if lm is not None else 0.0, hotword_weight]),
            lm=cache.arrays if cache is not None and cache.arrays is not None else _NO_ARRAYS,
        )

    @property
    def table(self) -> np.ndarray:
        """The word table the compiled search reads (a dummy one slot table without an LM)."""
        if self.cache is None:
            return _NO_WORDS
        return self.cache.table

    def resolve(self, nodes: np.ndarray, pending: np.ndarray) -> None:
        """Ask the LM for the pending (context, word) pairs (``pending``: :data:`PENDING` records)."""
        cache = self.cache
        assert cache is not None
        sids, hashes, labels, offsets = pending_words(nodes, self.starts_word, pending)
        if not len(sids):
            return
        clean = self.clean
        labs = labels.tolist()
        bounds = offsets.tolist()
        words = ["".join([clean[t] for t in reversed(labs[a:b])]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        cache.store(sids, hashes, words)


_NO_ARRAYS = no_words()
_NO_WORDS = records(1, WORD)
_NO_WORDS["sid"] = -1
