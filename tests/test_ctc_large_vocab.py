"""Large vocabularies (CJK characters, BPE pieces): memory O(nodes + candidates), never O(nodes x V) or O(N x T x V).

Oracles: a Python dict for the edge map; for the search, the same search over a reduced vocabulary holding only
the labels that ever become candidates (the other columns are below ``token_min_logp`` everywhere, so they can
change nothing); memory is measured by tracemalloc (numpy reports its buffers to it)."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest

from beamkit.ctc import CTCOptions, Vocabulary, prefix_beam_search
from beamkit.ctc.lm import LanguageModelFusion
from beamkit.ctc.prefix.kernel import clear_edges, rehash_edges
from beamkit.ctc.prefix.nodes import NODE, edge_find
from beamkit.lm import ArpaLM, build_arpa
from tests.ctc_legacy import build_legacy_decoder as build_ctcdecoder


def test_edge_map_agrees_with_a_dict() -> None:
    # the search's open-addressing edge map (find a slot, put, grow by rehashing, clear the known keys)
    # against a Python dict
    rng = np.random.default_rng(0)
    ek = np.full(16, -1, dtype=np.int64)
    ev = np.full(16, -1, dtype=np.int64)
    ref: dict[int, int] = {}

    def put(key: int, val: int) -> None:
        nonlocal ek, ev
        if 2 * (len(ref) + 1) > len(ek):  # the search grows the map before it is half full
            new_k, new_v = np.full(4 * len(ek), -1, dtype=np.int64), np.full(4 * len(ek), -1, dtype=np.int64)
            rehash_edges(ek, ev, new_k, new_v)
            ek, ev = new_k, new_v
        slot = edge_find(ek, key)
        ek[slot], ev[slot] = key, val
        ref[key] = val

    def get(key: int) -> int:
        slot = edge_find(ek, key)
        return int(ev[slot]) if ek[slot] == key else -1

    for _ in range(30):
        for key in rng.integers(0, 1 << 40, int(rng.integers(1, 300))).tolist():
            if key not in ref:
                put(key, int(rng.integers(0, 1 << 30)))
        probe = list(ref)[:50] + rng.integers(0, 1 << 40, 50).tolist()
        assert [get(k) for k in probe] == [ref.get(k, -1) for k in probe]
    assert int((ek != -1).sum()) == len(ref) and 2 * len(ref) <= len(ek)
    # clearing the edges of a node table: nodes 1.. with (parent, last) = divmod(key, V)
    V = 1 << 20
    keys = [k for k in ref if k // V < (1 << 40) // V]
    nodes = np.zeros(len(keys) + 1, dtype=NODE)
    nodes["parent"][1:] = [k // V for k in keys]
    nodes["last"][1:] = [k % V for k in keys]
    clear_edges(nodes, len(nodes), ek, ev, V)
    assert int((ek != -1).sum()) == len(ref) - len(keys) and all(get(k) == -1 for k in keys)


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
        knobs = dict(options=CTCOptions(beam_width=16, num_hypotheses=8, split_blank=False), lm=fusion)
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
    decoder.decoder.release_cached_memory()
    assert peak < 1 << 30, f"peak {peak / 2**20:.0f} MiB"
    assert texts[:3] == [decoder.decode(m) for m in lines[:3]]  # batched = alone
