"""Large vocabularies (CJK characters, BPE pieces): memory O(nodes + candidates), never O(nodes x V) or O(N x T x V).

Oracles: a Python dict for the edge map; for the search, the same search over a reduced vocabulary holding only
the labels that ever become candidates (the other columns are below ``token_min_logp`` everywhere, so they can
change nothing); memory is measured by tracemalloc (numpy reports its buffers to it)."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest

from beamkit.ctc import Vocabulary, build_arpa, build_ctcdecoder, prefix_beam_search, release_cached_memory
from beamkit.ctc.edges import EdgeMap
from beamkit.ctc.lm import ArpaLM, LanguageModelFusion


def test_edge_map_agrees_with_a_dict() -> None:
    rng = np.random.default_rng(0)
    edges = EdgeMap(4)
    ref: dict[int, int] = {}
    for _ in range(30):
        fresh = np.unique(rng.integers(0, 1 << 40, int(rng.integers(1, 300))))
        fresh = np.array([k for k in fresh.tolist() if k not in ref], dtype=np.int64)
        rng.shuffle(fresh)
        vals = rng.integers(0, 1 << 30, len(fresh))
        edges.put(fresh, vals)
        ref.update(zip(fresh.tolist(), vals.tolist(), strict=True))
        probe = np.concatenate([np.array(list(ref), dtype=np.int64)[:50], rng.integers(0, 1 << 40, 50)])
        want = [ref.get(k, -1) for k in probe.tolist()]
        assert edges.get(probe).tolist() == want
        assert [edges.get_one(k) for k in probe.tolist()] == want
    assert edges.count == len(ref) and 2 * edges.count <= len(edges.keys)
    for k in range(1 << 41, (1 << 41) + 40):  # one at a time, in plain Python
        edges.put_one(k, k % 97)
        ref[k] = k % 97
    probe = np.array(list(ref), dtype=np.int64)
    assert edges.get(probe).tolist() == list(ref.values())
    edges.clear(probe)  # emptying only the slots of the known keys
    assert (edges.keys == -1).all() and edges.count == 0
    edges.put(probe[:3], np.arange(3))
    edges.clear()
    assert edges.get(probe[:5]).tolist() == [-1] * 5


def bpe_vocabulary(V: int) -> list[str]:
    """``V`` labels: the blank, then BPE pieces (word-starting ``▁x`` and continuing ``x`` pieces)."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    pieces: list[str] = []
    n = 1
    while len(pieces) < V - 1:
        for i in range(len(letters) ** n):
            s = "".join(letters[(i // len(letters) ** j) % len(letters)] for j in range(n))
            pieces += ["▁" + s, s]
        n += 1
    return ["<pad>", *pieces[: V - 1]]


def spelled(labels: list[str], pieces: list[str], rng: np.random.Generator, floor: float = -30.0) -> np.ndarray:
    """Log-probabilities (not normalised: a search input) peaked on ``pieces`` with a confusable runner-up per
    frame and every other column at ``floor``."""
    V = len(labels)
    frames: list[int] = []
    for p in pieces:
        frames += [labels.index(p)] * 2 + [0]
    lp = np.full((len(frames), V), floor)
    for t, lab in enumerate(frames):
        lp[t, lab] = math.log(0.7)
        other = int(rng.integers(1, V))
        lp[t, other] = math.log(0.25)
        lp[t, 0] = max(lp[t, 0], math.log(0.04))
    return lp


def test_v8000_bpe_search_equals_the_search_over_the_labels_in_play() -> None:
    labels = bpe_vocabulary(8000)
    rng = np.random.default_rng(1)
    sentences = [["▁th", "e", "re", "▁is", "▁a", "▁ca", "t"], ["▁ab", "c", "▁zz", "q"], ["▁x", "yz", "▁th", "e"]]
    mats = [spelled(labels, s, rng) for s in sentences]
    corpus = ["there is a cat", "abc zzq", "xyz the", "there is a dog", "the cat"] * 3
    lm = LanguageModelFusion(ArpaLM.from_lines(build_arpa(corpus, order=2).splitlines()), alpha=0.5, beta=1.0)
    used = sorted({0} | {int(i) for m in mats for i in np.flatnonzero((m > -5.0).any(axis=0))})
    small_labels = [labels[i] for i in used]
    small = [m[:, used] for m in mats]
    for fusion in (None, lm):
        knobs = dict(beam_width=16, lm=fusion, num_hypotheses=8)
        big_vocab, small_vocab = Vocabulary.from_labels(labels), Vocabulary.from_labels(small_labels)
        tracemalloc.start()
        got = prefix_beam_search(mats, big_vocab, **knobs)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        want = prefix_beam_search(small, small_vocab, **knobs)
        assert [[(h.text, h.score, h.logit_score) for h in hs] for hs in got] == [
            [(h.text, h.score, h.logit_score) for h in hs] for hs in want
        ]
        assert peak < 64 << 20  # a dense child table alone was 4 bytes x V x 32,768 nodes = 1 GiB
    assert got[0][0].text == "there is a cat"


@pytest.mark.slow
def test_decode_batch_of_200_ocr_sized_lines_stays_far_under_1_gib() -> None:
    # 200 lines of float16 posteriors at V = 6,625 (PP-OCRv4's label count), T = 48: the dense child
    # table and the N x T x V float64 batch tried to allocate 16-60 GiB (MemoryError) before
    release_cached_memory()
    V, T, N = 6625, 48, 200
    labels = ["blank", *[chr(0x4E00 + i) for i in range(V - 2)], " "]
    rng = np.random.default_rng(2)
    lines = []
    for _ in range(N):
        p = np.zeros((T, V), dtype=np.float16)  # shape: (T, V) a peak, a runner-up, the rest below 1e-4
        path = rng.integers(1, V, T)
        path[rng.random(T) < 0.5] = 0
        p[np.arange(T), rng.integers(1, V, T)] = 0.15
        p[np.arange(T), path] = 0.8
        lines.append(p)
    decoder = build_ctcdecoder(labels, blank=0, input_kind="probs")
    tracemalloc.start()
    texts = decoder.decode_batch(None, lines)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    release_cached_memory()
    assert peak < 1 << 30, f"peak {peak / 2**20:.0f} MiB"
    assert texts[:3] == [decoder.decode(m) for m in lines[:3]]  # batched = alone
