"""The driver of :class:`~beamkit.ctc.lexicon.search.LexiconSearch`: the search's state in the arrays of
:mod:`beamkit.ctc.lexicon.kernel`, its frame loop compiled by numba (plain Python without numba), a language model
in Python asked only for the transitions the loop has not seen."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ..jit import note_if_cold
from .lm import ZeroLM
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
        self.external = not isinstance(search.lm, ZeroLM)
        self.trie = _trie_arrays(search.trie)
        self.options = kernel.Options(
            np.array([o.beam_threshold, o.lm_weight, o.word_score, o.unk_score, o.sil_score], dtype=np.float64),
            np.array([o.beam_size, o.beam_size_token or 1 << 30, search.sil, search.blank, search.unk, int(o.log_add)]),
        )
        self.table = kernel.new_table(1 << 12, 1 << 24, self.external, 1)
        self.work: Any = None
        self.beam: Any = None
        self.objects: list[Any] = []
        self.ids: dict[int, int] = {}
        self.final: list[tuple[float, int, float, float, int]] | None = None

    def begin(self) -> None:
        """One hypothesis at the LM's start, on the silence token, at the trie's root."""
        size = self.search.options.beam_size
        t = self.table
        t.keys.fill(self.k.EMPTY)
        t.meta[0], t.meta[1], t.meta[4] = 0, 1, 0
        self.objects, self.ids = [], {}
        if self.external:
            self._state_id(self.search.lm.start(False))
        steps = 64
        self.beam = self.k.Beam(
            np.zeros(size),
            np.zeros(size, dtype=np.int64),
            np.full(size, 0 if self.trie.max_score.size else -1),
            np.full(size, self.search.sil, dtype=np.int64),
            np.zeros(size, dtype=bool),
            np.zeros(size),
            np.zeros(size),
            np.ones(1, dtype=np.int64),
            np.zeros(1, dtype=np.int64),
            np.full((steps, size), self.search.sil, dtype=np.int64),
            np.full((steps, size), -1, dtype=np.int64),
            np.full((steps, size), -1, dtype=np.int64),
        )
        self.final = None

    def _state_id(self, obj: Any) -> int:
        sid = self.ids.get(id(obj))
        if sid is None:
            sid = self.ids[id(obj)] = len(self.objects)
            self.objects.append(obj)
        return sid

    def _grow_back(self, frames: int) -> None:
        b = self.beam
        need = int(b.step[0]) + frames + 2
        if b.back_token.shape[0] < need:
            rows = max(need, 2 * b.back_token.shape[0])
            grown = [np.full((rows, b.back_token.shape[1]), -1, dtype=np.int64) for _ in range(3)]
            for new, old in zip(grown, (b.back_token, b.back_word, b.back_parent), strict=True):
                new[: old.shape[0]] = old
            self.beam = b._replace(back_token=grown[0], back_word=grown[1], back_parent=grown[2])

    def _grow_table(self, extra: int) -> None:
        t = self.table
        if 2 * (int(t.meta[0]) + extra) <= t.keys.shape[0]:
            return
        capacity = t.keys.shape[0]
        while 2 * (int(t.meta[0]) + extra) > capacity:
            capacity *= 2
        into = self.k.new_table(capacity, int(t.meta[2]), self.external, int(t.meta[1]))
        self.k.table_move(t.keys, t.child, t.score, into)
        into.meta[4] = t.meta[4]
        self.table = into

    def _work(self, n_tokens: int) -> Any:
        o = self.search.options
        k = min(o.beam_size_token or n_tokens, n_tokens)
        labels = int(np.diff(self.trie.word_start).max()) if self.trie.word_start.size > 1 else 0
        cap = o.beam_size * (k * (labels + 2) + 2)
        if self.work is None or self.work.cand.shape[0] < cap or self.work.tokens.shape[0] != n_tokens:
            from .candidates import new_work

            self.work = new_work(cap, n_tokens)
        return self.work

    def step(self, emissions: np.ndarray) -> None:
        """Decode more frames (shape: (T, N) float32)."""
        T, N = emissions.shape
        work = self._work(N)
        self._grow_back(T)
        emissions = np.ascontiguousarray(emissions)
        note_if_cold(self.k.run_lexicon_frames)  # the first decode after an install compiles the loop
        t = 0
        while True:
            status, t = self.k.run_lexicon_frames(emissions, t, self.beam, self.trie, self.table, self.options, work)
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
        """The LM's end-of-sentence score, merged and sorted as the interpreted search does."""
        o = self.search.options
        b = self.beam
        rows = range(int(b.size[0]))
        lexicon = self.trie.max_score.size > 0
        nice = lexicon and any(b.lex[h] == 0 for h in rows)
        best = -math.inf
        cands: list[tuple[float, int, int, float, float, int]] = []
        for h in rows:
            if nice and b.lex[h] != 0:
                continue
            if self.external:
                obj, s = self.search.lm.finish(self.objects[int(b.lm[h])])
                lm_id = self._state_id(obj)
            else:
                lm_id, s = int(b.lm[h]), 0.0
            score = float(b.score[h]) + o.lm_weight * s
            if score >= best:
                best = score
            if score >= best - o.beam_threshold:
                cands.append((score, lm_id, int(b.lex[h]), float(b.am[h]), float(b.lm_sum[h]) + s, h))
        groups: dict[tuple[int, int], list[tuple[float, int, int, float, float, int]]] = {}
        for c in cands:
            if c[0] >= best - o.beam_threshold:
                groups.setdefault((c[1], c[2]), []).append(c)
        merged = []
        for group in groups.values():
            group.sort(key=lambda c: c[0], reverse=True)
            acc = group[0][0]
            for other in group[1:]:
                hi, lo = (acc, other[0]) if acc >= other[0] else (other[0], acc)
                acc = hi + math.log1p(math.exp(lo - hi)) if o.log_add else hi
            top = group[0]
            merged.append((acc, top[5], top[3], top[4], top[1]))
        merged.sort(key=lambda c: c[0], reverse=True)
        self.final = [(score, h, am, lm, 0) for score, h, am, lm, _ in merged[: o.beam_size]]
        self.search.frames += 1

    def results(self, limit: int | None = None) -> list[LexiconResult]:
        """The final hypotheses, best first (empty before :meth:`end`); ``limit``: only the first ones."""
        if self.final is None:
            return []
        final = self.final[:limit]
        rows = np.array([h for _, h, _, _, _ in final], dtype=np.int64)
        tokens, words = self.k.backtrace(self.beam, rows, self.search.sil)
        return [
            LexiconResult(tokens[i].tolist(), words[i].tolist(), score, am, lm)
            for i, (score, _, am, lm, _) in enumerate(final)
        ]


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
