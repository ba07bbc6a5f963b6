"""The CTC prefix beam search as begin / frames / end, one utterance after another.

:func:`search_candidates` runs the compiled frame loop (:func:`beamkit.ctc.prefix.kernel.run_frames`) over each
utterance's candidate labels and does in Python what it hands back: growing storage, answering LM queries
(:meth:`beamkit.ctc.prefix.fusion.Fusion.resolve`), recording frames for a trace. The end of an utterance is here
too: beams with the same final text merge by log-sum-exp, the end-of-utterance LM scores are added, and the
hypotheses are ranked and spelled.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import Any, NamedTuple, TypeVar

import numpy as np

from beamkit._checks import check_int
from beamkit.ops import NEG_INF

from ..jit import COMPILED, note_if_cold, records, warn_if_interpreted
from ..lm import Hotwords, LanguageModelFusion
from ..options import CTCOptions
from ..posteriors import FrameCandidates
from ..search import CTCHypothesis, CTCRecorder, FrameSnapshot
from ..vocab import Vocabulary
from . import kernel as K
from . import records as R
from .chartrie import CharTrie
from .final import end_utterance, texts_of
from .fusion import (
    MAX_CACHED_STATES,
    PENDING,
    Fusion,
    LabelTables,
    LMCache,
    fresh_lm_cache,
    lm_cache_key,
)  # fmt: skip
from .lmwords import word_arrays
from .nodes import NODE, init_root


class Workspace:
    """Storage of a search (nodes, edges, word records, beams, rows), grown when the frame loop asks and
    reused from one utterance, and one call, to the next."""

    def __init__(self, history: int, nodes: int, width: int, rows: int) -> None:
        """Room for ``nodes`` nodes and frames of ``rows`` rows with ``width`` beams."""
        self.history = history
        self.nodes = records(nodes, NODE)
        self.whist = np.empty((nodes, history), dtype=np.uint64)
        self.ek = np.full(_pow2(4 * nodes), -1, dtype=np.int64)
        self.ev = np.full(len(self.ek), -1, dtype=np.int64)
        self.recs = records(max(1024, 4 * width), R.RECORD)
        self.cnt = np.zeros(8, dtype=np.int64)
        self.width = 0
        self.rows_cap = 0
        self.fit(width, rows)

    def fit(self, width: int, rows: int) -> None:
        """Make the per-frame arrays hold ``width`` beams and ``rows`` rows."""
        if width > self.width:
            self.width = width
            self.beams = records(width, R.BEAM)
            self.nxt = records(width, R.BEAM)
        if rows > self.rows_cap:
            self.rows_cap = rows
            self.rows = records(rows, R.ROW)
            self.merged = records(rows, R.MERGED)
            self.order = np.empty(rows, dtype=np.int64)
            self.scratch = np.empty((3, rows), dtype=np.int64)
            self.pend = records(rows, PENDING)
            self.mslot = np.full(_pow2(2 * rows), -1, dtype=np.int64)

    def grow(self, reason: int) -> None:
        """Grow what the frame loop ran out of (nodes 4x, edges 4x, word records 4x)."""
        if reason == R.NEED_NODES:
            n = len(self.nodes)
            nodes = records(4 * n, NODE)
            nodes[:n] = self.nodes
            whist = np.empty((4 * n, self.history), dtype=np.uint64)
            whist[:n] = self.whist
            self.nodes, self.whist = nodes, whist
        elif reason == R.NEED_EDGES:
            ek = np.full(4 * len(self.ek), -1, dtype=np.int64)
            ev = np.full(len(ek), -1, dtype=np.int64)
            K.rehash_edges(self.ek, self.ev, ek, ev)
            self.ek, self.ev = ek, ev
        else:
            recs = records(4 * len(self.recs), R.RECORD)
            recs[: len(self.recs)] = self.recs
            self.recs = recs

    def store(self) -> R.Store:
        """The arrays as the frame loop takes them."""
        return R.Store(
            self.nodes, self.whist, self.ek, self.ev, self.recs, self.pend, self.cnt, self.beams, self.nxt,
            self.rows, self.merged, self.mslot, self.order, self.scratch,
        )  # fmt: skip

    @property
    def nbytes(self) -> int:
        """Bytes held."""
        arrays = (self.nodes, self.whist, self.ek, self.ev, self.recs, self.beams, self.rows, self.merged)
        return sum(a.nbytes for a in arrays)


def _pow2(n: int) -> int:
    """The smallest power of two >= ``n``."""
    return 1 << max(4, int(n - 1).bit_length())


SPARE_MAX_BYTES = 1 << 28  # a workspace larger than this is freed after its search, not kept


class SearchCaches:
    """What one decoder keeps from a search to the next, shared with no other decoder: its vocabulary's label
    tables, its LM's cache of scored (context, word) pairs (made afresh when the LM's weights change or the cache
    grows past :data:`~beamkit.ctc.prefix.fusion.MAX_CACHED_STATES` contexts), the last search's fusion and hotword
    trie, and one spare workspace (first touches of fresh memory cost more than frames). Thread-safe; it
    pickles empty (a process pool's worker starts its own)."""

    def __init__(self, vocab: Vocabulary) -> None:
        """Empty caches for searches over ``vocab``."""
        self.vocab = vocab
        self._lock = threading.Lock()
        self._labels: LabelTables | None = None
        self._lm: tuple[tuple[Any, ...], LMCache] | None = None
        self._hot: tuple[frozenset[str], CharTrie | None] = (frozenset(), None)
        self._hot_list: tuple[str, ...] | None = None  # the hotwords the words of _hot were read from
        self._fusion: tuple[tuple[Any, ...], Fusion] | None = None
        self._spare: list[Workspace] = []

    def __getstate__(self) -> dict[str, Any]:
        """Only the vocabulary: the caches are rebuilt where it is unpickled."""
        return {"vocab": self.vocab}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Empty caches over the pickled vocabulary."""
        self.__init__(state["vocab"])  # type: ignore[misc]

    def fusion(self, lm: LanguageModelFusion | None, hotwords: tuple[str, ...] | None, weight: float) -> Fusion:
        """The fusion of a search with ``lm`` and the hotwords (the previous search's when nothing changed)."""
        with self._lock:
            if self._labels is None:
                self._labels = LabelTables(self.vocab)
            labels = self._labels
            cache = self._lm_cache(lm, labels) if lm is not None else None
            if hotwords != self._hot_list:  # the list of the last call: its words and trie stand (no set-up per call)
                words = Hotwords(hotwords, weight).words  # a phrase counts word by word, as in pyctcdecode
                if self._hot[0] != words:
                    self._hot = (words, CharTrie(words, labels.alphabet) if words else None)
                self._hot_list = hotwords
            key = (id(lm), id(cache), hotwords, weight)
            if self._fusion is None or self._fusion[0] != key:
                self._fusion = (key, Fusion(labels, cache, self._hot[1], weight))
            return self._fusion[1]

    def sharing_labels(self) -> SearchCaches:
        """New caches over the same vocabulary that start with these label tables and the last hotword trie
        (both read-only once built: a vocabulary of 8,000 BPE pieces takes about 0.1 s to tabulate); the LM
        cache, the fusion and the workspace are the new one's own."""
        with self._lock:
            if self._labels is None:
                self._labels = LabelTables(self.vocab)
            out = SearchCaches(self.vocab)
            out._labels, out._hot, out._hot_list = self._labels, self._hot, self._hot_list
        return out

    def _lm_cache(self, lm: LanguageModelFusion, labels: LabelTables) -> LMCache:
        key = (id(lm), *lm_cache_key(lm, labels.alphabet_key))
        got = self._lm
        if got is None or got[0] != key or got[1].lm is not lm or len(got[1].states) > MAX_CACHED_STATES:
            old = got[1] if got is not None and got[1].lm is lm else None
            same_alphabet = old is not None and got is not None and got[0][1] == key[1]
            cache = fresh_lm_cache(lm, labels, old, same_alphabet)
            model = lm.arrays_model()
            if model is not None:  # an ARPA model: read from its compiled arrays inside the loop
                cache.model = model
                cache.arrays = word_arrays(lm, model, labels.alphabet, labels.alphabet_key)
            self._lm = got = (key, cache)
        return got[1]

    def take_workspace(self, history: int, nodes: int, width: int, rows: int) -> Workspace:
        """The spare workspace (fitted to ``width`` beams and ``rows`` rows) when its LM history matches, else
        a new one."""
        with self._lock:
            for i, ws in enumerate(self._spare):
                if ws.history == history:
                    del self._spare[i]
                    ws.fit(width, rows)
                    return ws
        return Workspace(history, nodes, width, rows)

    def give_back(self, ws: Workspace) -> None:
        """Keep ``ws`` (cleared) as the spare workspace, unless it is over :data:`SPARE_MAX_BYTES`."""
        if ws.nbytes <= SPARE_MAX_BYTES:
            with self._lock:
                self._spare[:] = [ws]

    @property
    def spare_bytes(self) -> int:
        """Bytes held by the spare workspace."""
        with self._lock:
            return sum(ws.nbytes for ws in self._spare)

    def release(self) -> int:
        """Free the spare workspace; returns the bytes released."""
        with self._lock:
            freed = sum(ws.nbytes for ws in self._spare)
            self._spare.clear()
        return freed


class SearchRun(NamedTuple):
    """What every utterance of one search call shares."""

    vocab: Vocabulary
    fusion: Fusion
    opts: CTCOptions
    knobs: R.Knobs
    cands: FrameCandidates
    frame_input: R.FrameInput
    recorder: CTCRecorder | None


def search_candidates(
    cands: FrameCandidates,
    caches: SearchCaches,
    lm: LanguageModelFusion | None,
    opts: CTCOptions,
    recorder: CTCRecorder | None = None,
    threads: int | None = None,
) -> list[list[CTCHypothesis]]:
    """Prefix beam search of the candidates of checked log-probabilities (no NaN) over ``caches.vocab`` with an
    optional fused ``lm``: one list of hypotheses per utterance, at most ``opts.out_k`` each. ``caches``: the
    decoder's (:class:`SearchCaches`), read and refilled.

    Utterances are searched one after another by each of ``threads`` threads (default: one per CPU core
    available, at most one per :data:`UTTERANCES_PER_THREAD` utterances); the compiled frame loop runs
    without the GIL, and the results do not depend on the thread count. A ``recorder`` is told every frame
    (one thread; the search stops after each frame)."""
    warn_if_interpreted()
    note_if_cold(K.run_frames)
    voc = caches.vocab
    fusion = caches.fusion(lm, opts.hotwords, opts.hotword_weight)
    history = max(1, lm.order - 1) if lm is not None else 1
    N, T = cands.n, cands.T
    counts = cands.count.reshape(N, T) if N else np.zeros((0, 0), dtype=np.int64)  # shape: (N, T)
    c_off = np.zeros(N * T + 1, dtype=np.int64)  # shape: (N * T + 1,)
    np.cumsum(cands.count, out=c_off[1:])
    width = int(opts.beam_width)
    rows = max(16, width * (int(counts.max(initial=1)) + 1))
    nodes = min(1 << 22, max(1 << 12, int(cands.lens.sum(initial=0)) * min(width, 16) // max(N, 1)))
    knobs = R.Knobs(
        width, int(voc.blank), int(voc.size), bool(opts.split_blank), bool(opts.prune_history),
        bool(opts.word_frames), recorder is not None, float(opts.beam_prune_logp),
    )  # fmt: skip
    run = SearchRun(voc, fusion, opts, knobs, cands, R.FrameInput(c_off, cands.labels, cands.values), recorder)

    def work(utts: range) -> list[list[CTCHypothesis]]:
        ws = caches.take_workspace(history, nodes, width, rows)
        quiet = nullcontext() if COMPILED else np.errstate(over="ignore")  # hashes wrap; numpy scalars warn
        out: list[list[CTCHypothesis]] = []
        with quiet:  # clearing the workspace walks the hashes too
            try:
                for u in utts:
                    out.append(_utterance(ws, run, u))
            finally:
                _clear(ws, voc.size)
                caches.give_back(ws)
        return out

    return spread(N, 1 if recorder is not None else threads, work)


def _utterance(ws: Workspace, run: SearchRun, u: int) -> list[CTCHypothesis]:
    """Search utterance ``u`` on ``ws`` from its first frame to its hypotheses."""
    _begin(ws, run.vocab)
    recorder, fusion = run.recorder, run.fusion
    if fusion.static.lm.flags[0]:
        ws.nodes["sid"][0] = fusion.static.lm.start[0]  # the contexts are the compiled model's states
    if recorder is not None:
        recorder.begin(u, int(run.cands.lens[u]), lambda node: texts_of(ws, fusion, np.array([node]))[0])
    _frames(ws, run, u)
    hyps, finals = end_utterance(ws, fusion, run.opts)
    if recorder is not None:
        recorder.end(u, hyps, finals)
    return hyps


_R = TypeVar("_R")


def spread(n: int, threads: int | None, run: Callable[[range], list[_R]]) -> list[_R]:
    """``run`` over items ``0 .. n-1`` dealt round-robin to :func:`thread_count` threads (``run`` gets a range
    of item indices and returns one result per index); the results in item order."""
    k = thread_count(threads, n)
    if k == 1:
        return run(range(n))
    parts = [range(i, n, k) for i in range(k)]
    out: list[_R | None] = [None] * n
    with ThreadPoolExecutor(k) as pool:
        for part, got in zip(parts, pool.map(run, parts), strict=True):
            for j, r in zip(part, got, strict=True):
                out[j] = r
    return out  # type: ignore[return-value]


UTTERANCES_PER_THREAD = 8  # fewer utterances than this per thread are not worth a thread


def thread_count(threads: int | None, n: int) -> int:
    """Threads for ``n`` utterances (``threads``: asked for; None: one per available core, at least
    :data:`UTTERANCES_PER_THREAD` utterances each); 1 when the search runs interpreted."""
    if threads is not None:
        check_int("threads", threads, least=1)
        return min(threads, max(n, 1)) if COMPILED else 1
    if not COMPILED:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, n // UTTERANCES_PER_THREAD))


def _clear(ws: Workspace, V: int) -> None:
    """Empty the edge map of the nodes made over a vocabulary of ``V`` labels."""
    if ws.cnt[R.N_NODES] > 1:
        K.clear_edges(ws.nodes, int(ws.cnt[R.N_NODES]), ws.ek, ws.ev, V)
    ws.cnt[:] = 0


def _begin(ws: Workspace, voc: Vocabulary) -> None:
    """Reset the workspace to the root beam of a new utterance."""
    _clear(ws, voc.size)
    cnt = ws.cnt
    init_root(ws.nodes, ws.whist, voc.space)
    cnt[R.N_NODES] = 1
    b = ws.beams
    b[0] = (0, 0.0, NEG_INF, -1, -1, -1)
    cnt[R.N_BEAMS] = 1


def _frames(ws: Workspace, run: SearchRun, utt: int) -> None:
    """Run the frame loop over utterance ``utt``'s frames, dealing with each reason it stops for."""
    fusion, knobs, frame_input, recorder = run.fusion, run.knobs, run.frame_input, run.recorder
    row0, n_frames = utt * run.cands.T, int(run.cands.lens[utt])
    t = 0
    static = fusion.static
    # a compiled model's search writes nothing shared: no lock to take
    reading = fusion.cache.lock.shared if fusion.cache is not None and fusion.cache.arrays is None else nullcontext
    while True:
        with reading():
            status, t = K.run_frames(static, fusion.table, ws.store(), frame_input, knobs, row0, t, n_frames)
        if status == R.DONE:
            return
        if status == R.NEED_LM:
            fusion.resolve(ws.nodes, ws.pend[: ws.cnt[R.N_PENDING]])
        elif status == R.FRAME:
            assert recorder is not None
            recorder.frame(utt, _snapshot(ws, run.cands, frame_input.offsets, row0, t - 1))
        else:
            ws.grow(status)


def _snapshot(ws: Workspace, cands: FrameCandidates, c_off: np.ndarray, row0: int, t: int) -> FrameSnapshot:
    """The record of frame ``t``, just searched."""
    M = int(ws.cnt[R.N_MERGED])
    g = ws.merged[ws.order[:M]]
    lo, hi = int(c_off[row0 + t]), int(c_off[row0 + t + 1])
    pb, pnb = g["pb"].copy(), g["pnb"].copy()
    return FrameSnapshot(
        t=t,
        cand_labels=cands.labels[lo:hi].copy(),
        cand_lp=cands.values[lo:hi].copy(),
        prefix=g["node"].copy(),
        source=ws.rows["src"][g["rep"]].copy(),
        label=g["label"].copy(),
        ends_in_blank=pnb == NEG_INF,
        p_b=pb,
        p_nb=pnb,
        lm=ws.nodes["score"][g["node"]].copy(),
        total=g["total"].copy(),
        merged=g["n"].copy(),
        fate=g["fate"].copy(),
    )


__all__ = ["COMPILED", "CTCHypothesis", "CTCRecorder", "FrameSnapshot", "SearchCaches", "search_candidates"]
