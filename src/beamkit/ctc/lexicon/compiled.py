"""The driver of :class:`~beamkit.ctc.lexicon.search.LexiconSearch`: the search's state in the arrays of
:mod:`beamkit.ctc.lexicon.kernel`, its frame loop compiled by numba (plain Python without numba), a language model
in Python asked only for the transitions the loop has not seen."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..jit import note_if_cold
from .lm import NGramWords, ZeroLM
from .options import LexiconResult
from .trie import LexiconTrie

if TYPE_CHECKING:
    from .search import LexiconSearch


class CompiledSearch:
    """The same search with its frame loop compiled (:mod:`beamkit.ctc.lexicon.kernel`): the beam, back-pointers,
    trie and LM states live in arrays; a language model in Python is asked only for the transitions the loop has
    not seen (it resumes the frame afterwards)."""

    def __init__(self, search: LexiconSearch) -> None:
        """Arrays for ``search``'s options, trie and LM."""
        from . import kernel

        self.k = kernel
        self.search = search
        o = search.options
        self.arrays_lm = isinstance(search.lm, NGramWords)  # a compiled ARPA model: scored inside the loop
        self.external = not isinstance(search.lm, ZeroLM) and not self.arrays_lm  # a LM asked in Python
        self.trie = _trie_arrays(search.trie)
        self.options = kernel.Options(
            np.array([o.beam_threshold, o.lm_weight, o.word_score, o.unk_score, o.sil_score], dtype=np.float64),
            np.array([o.beam_size, o.beam_size_token or 1 << 30, search.sil, search.blank, search.unk, int(o.log_add)]),
        )
        self.table = kernel.new_table(1 << 12, 1 << 24, self.external, 1)
        kind = kernel.ARRAY_LM if self.arrays_lm else kernel.PYTHON_LM if self.external else kernel.NO_LM
        self.table.meta[3] = kind
        self.lm = _lm_arrays(search.lm, self.table.keys.shape[0])
        self.lm_start = search.lm.model.begin if isinstance(search.lm, NGramWords) else 0
        # the most words one trie node ends (room for a frame's candidates)
        self.labels = int(np.diff(self.trie.word_start).max()) if self.trie.word_start.size > 1 else 0
        self.work: Any = None
        self.beam = self._new_beam(64)
        self.objects: list[Any] = []
        self.ids: dict[int, int] = {}
        self.ended = False

    def _new_beam(self, steps: int) -> Any:
        """The beam's arrays, with back-pointers for ``steps`` steps (made once; grown for longer utterances)."""
        size = self.search.options.beam_size
        i = lambda: np.zeros(size, dtype=np.int64)  # noqa: E731
        back = lambda: np.zeros((steps, size), dtype=np.int64)  # noqa: E731
        one = lambda: np.zeros(1, dtype=np.int64)  # noqa: E731
        return self.k.Beam(
            score=np.zeros(size),
            lm=i(),
            lex=i(),
            token=i(),
            blank=np.zeros(size, dtype=bool),
            am=np.zeros(size),
            lm_sum=np.zeros(size),
            size=one(),
            step=one(),
            back_token=back(),
            back_word=back(),
            back_parent=back(),
        )

    def begin(self) -> None:
        """One hypothesis at the LM's start, on the silence token, at the trie's root (in the arrays of the
        previous utterance: nothing is allocated)."""
        t = self.table
        t.keys.fill(self.k.EMPTY)
        t.meta[0], t.meta[1], t.meta[4] = 0, 1, 0
        self.objects, self.ids = [], {}
        if self.external:
            self._state_id(self.search.lm.start(False))
        if self.arrays_lm:
            self.lm.context[0] = self.lm_start  # the state after <s>
        b, sil = self.beam, self.search.sil
        for row, value in (
            (b.score, 0.0),
            (b.lm, 0),
            (b.lex, 0 if self.trie.max_score.size else -1),
            (b.token, sil),
            (b.blank, False),
            (b.am, 0.0),
            (b.lm_sum, 0.0),
        ):
            row[0] = value
        b.size[0], b.step[0] = 1, 0
        b.back_token[0], b.back_word[0], b.back_parent[0] = sil, -1, -1
        self.ended = False

    def _state_id(self, obj: Any) -> int:
        sid = self.ids.get(id(obj))
        if sid is None:
            sid = self.ids[id(obj)] = len(self.objects)
            self.objects.append(obj)
        return sid

    def _grow_back(self, frames: int) -> None:
        """Room for the back-pointers of ``frames`` more frames and the end (the arrays double when short)."""
        b = self.beam
        need = int(b.step[0]) + frames + 2
        if b.back_token.shape[0] < need:
            grown = self._new_beam(max(need, 2 * b.back_token.shape[0]))
            for new, old in zip(grown, b, strict=True):
                new[: old.shape[0]] = old
            self.beam = grown

    def _grow_table(self, extra: int) -> None:
        t = self.table
        if 2 * (int(t.meta[0]) + extra) <= t.keys.shape[0]:
            return
        capacity = t.keys.shape[0]
        while 2 * (int(t.meta[0]) + extra) > capacity:
            capacity *= 2
        into = self.k.new_table(capacity, int(t.meta[2]), self.external, int(t.meta[1]))
        self.k.table_move(t.keys, t.child, t.score, into)
        into.meta[3:] = t.meta[3:]
        self.table = into
        if self.lm.context.shape[0] < capacity:
            context = np.zeros(capacity, dtype=np.int64)
            context[: self.lm.context.shape[0]] = self.lm.context
            self.lm = self.lm._replace(context=context)

    def _work(self, n_tokens: int) -> Any:
        """The frame's scratch arrays, made at the first call (again only for a wider vocabulary)."""
        o = self.search.options
        k = min(o.beam_size_token or n_tokens, n_tokens)
        cap = o.beam_size * (k * (self.labels + 2) + 2)
        if self.work is None or self.work.cand.shape[0] < cap or self.work.tokens.shape[0] != n_tokens:
            from .candidates import new_work

            self.work = new_work(cap, n_tokens)
        return self.work

    def step(self, emissions: np.ndarray) -> None:
        """Decode more frames (shape: (T, N) float32)."""
        T, N = emissions.shape
        if self.arrays_lm and not self.trie.max_score.size and N > self.lm.word_ids.shape[0]:
            # lexicon-free, the LM scores tokens as words: each token needs one (the compiled loop reads no further)
            n = self.lm.word_ids.shape[0]
            raise ValueError(f"word index {N - 1} is out of range for the LM's {n} words")
        work = self._work(N)
        self._grow_back(T)
        emissions = np.ascontiguousarray(emissions)
        note_if_cold(self.k.run_lexicon_frames)  # the first decode after an install compiles the loop
        t = 0
        while True:
            status, t = self.k.run_lexicon_frames(
                emissions, t, self.beam, self.trie, self.table, self.options, work, self.lm
            )
            if status == self.k.DONE:
                break
            if status == self.k.GROW:  # a frame makes at most beam_size states
                self._grow_table(self.search.options.beam_size)
                continue
            found = min(int(self.table.meta[4]), work.misses.shape[0])
            self._grow_table(found)
            pairs = sorted(set(map(tuple, work.misses[:found].tolist())))
            stride = int(self.table.meta[2])
            lm, objects, state_id = self.search.lm, self.objects, self._state_id
            keys, children, scores = [], [], []
            for parent, index in pairs:
                child, score = lm.score(objects[parent], index)
                keys.append(parent * stride + index + 1)
                children.append(state_id(child))
                scores.append(score)
            t_ = self.table
            self.k.table_put_many(
                t_.keys,
                t_.child,
                t_.score,
                t_.meta,
                np.array(keys, dtype=np.int64),
                np.array(children, dtype=np.int64),
                np.array(scores, dtype=np.float64),
            )

    def end(self) -> None:
        """The LM's end-of-sentence score, then one more step on the silence token, merged and cut as a frame is
        (with a lexicon, only hypotheses at a word boundary finish, unless none is)."""
        b = self.beam
        rows = int(b.size[0])
        lexicon = self.trie.max_score.size > 0
        nice = lexicon and bool((b.lex[:rows] == 0).any())
        if self.external:
            lm_ids, scores = np.zeros(rows, dtype=np.int64), np.zeros(rows)
            for h in range(rows):
                if not nice or b.lex[h] == 0:
                    obj, scores[h] = self.search.lm.finish(self.objects[int(b.lm[h])])
                    lm_ids[h] = self._state_id(obj)
        elif self.arrays_lm:  # scored in finish_frames, which makes the states after </s> the beam keeps
            self._grow_table(rows)
            lm_ids, scores = np.zeros(rows, dtype=np.int64), np.zeros(rows)
        else:
            lm_ids, scores = b.lm[:rows].copy(), np.zeros(rows)
        self._grow_back(0)
        work = self._work(1 if self.work is None else self.work.tokens.shape[0])  # end() may come before step()
        self.k.finish_frames(b, lm_ids, scores, nice, self.options, work, self.table, self.lm)
        self.ended = True
        self.search.frames += 1

    def results(self, limit: int | None = None) -> list[LexiconResult]:
        """The final hypotheses, best first (empty before :meth:`end`); ``limit``: only the first ones."""
        if not self.ended:
            return []
        b = self.beam
        rows = np.arange(min(int(b.size[0]), limit if limit is not None else int(b.size[0])), dtype=np.int64)
        tokens, words = self.k.backtrace(b, rows)
        return [
            LexiconResult(tokens[i].tolist(), words[i].tolist(), float(b.score[r]), float(b.am[r]), float(b.lm_sum[r]))
            for i, r in enumerate(rows.tolist())
        ]

    def paths(self, limit: int, blank: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, float]]:
        """The first ``limit`` final hypotheses read as torchaudio reads a path (empty before :meth:`end`): per
        hypothesis its tokens, their steps (int32), the ids of the words ending and its score."""
        if not self.ended:
            return []
        b = self.beam
        rows = np.arange(min(int(b.size[0]), limit), dtype=np.int64)
        tokens, steps, words, at = self.k.read_paths(b, rows, blank)
        return [
            (tokens[t0:t1], steps[t0:t1], words[w0:w1], float(b.score[r]))
            for r, (t0, w0), (t1, w1) in zip(rows.tolist(), at[:-1].tolist(), at[1:].tolist(), strict=True)
        ]


def _lm_arrays(lm: Any, capacity: int) -> Any:
    """The loop's view of a compiled ARPA model (a placeholder of empty arrays for any other LM)."""
    from ..ngram import NGramArrays
    from .kernel import LMArrays

    if isinstance(lm, NGramWords):
        return LMArrays(lm.model.arrays, lm.word_ids, np.zeros(capacity, dtype=np.int64))
    z, f = np.zeros(16, dtype=np.int64), np.zeros(1, dtype=np.float32)
    none = NGramArrays(np.full(16, -1, dtype=np.int64), z, f, f, z[:1], z[:1], np.array([1, 1, 0, 0], dtype=np.int64))
    return LMArrays(none, np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64))


def _trie_arrays(trie: LexiconTrie | None) -> Any:
    """A trie as the kernel's CSR arrays (node 0: the root); empty arrays without a lexicon."""
    from .kernel import TrieArrays

    if trie is None:
        z = np.zeros(0, dtype=np.int64)
        return TrieArrays(np.zeros(1, dtype=np.int64), z, z, np.zeros(0), np.zeros(1, dtype=np.int64), z)
    nodes = [trie.root]
    index = {id(trie.root): 0}
    i = 0
    while i < len(nodes):
        for child in nodes[i].children.values():
            index[id(child)] = len(nodes)
            nodes.append(child)
        i += 1
    child_start, child_token, child_node, word_start, words = [0], [], [], [0], []
    for node in nodes:
        for token, child in node.children.items():
            child_token.append(token)
            child_node.append(index[id(child)])
        child_start.append(len(child_token))
        words.extend(node.words)
        word_start.append(len(words))
    as64 = lambda x: np.array(x, dtype=np.int64)  # noqa: E731
    return TrieArrays(
        as64(child_start),
        as64(child_token),
        as64(child_node),
        np.array([n.max_score for n in nodes], dtype=np.float64),
        as64(word_start),
        as64(words),
    )
