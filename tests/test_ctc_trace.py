"""CTC prefix-search traces: the recorder, the trace's JSON, its drawings, and ``beamkit ctc explain``.

Oracles: a prefix beam search worked by hand on 3 frames (numbers in the comments below), one frame of prefix
beam search expanded in plain Python from the previous frame's recorded beams, the best path read off the
posterior matrix with numpy, brute-force enumeration of every label path for tiny inputs, and ``ctc decode``'s
own output for the command line.
"""

from __future__ import annotations

import itertools
import json
import math
import xml.etree.ElementTree as ET
from typing import NamedTuple

import numpy as np
import pytest

from beamkit.cli import entry as cli
from beamkit.ctc import CTCOptions, Decoder, prefix_beam_search
from beamkit.ctc.posteriors import collect_candidates, dense_part
from beamkit.ctc.search import FrameSnapshot
from beamkit.ctc.trace import CTCTrace, CTCTraceRecorder, collapse, join_labels
from beamkit.viz import to_dot, to_html, to_svg
from beamkit.viz.ctc import ctc_layout, quiet_frames

LABELS = ["", "a", "b"]  # blank, a, b
BLANK = 0
LN = math.log
NEG = -math.inf


class Hyp(NamedTuple):
    """What the recorder reads of a returned hypothesis."""

    text: str
    score: float
    logit_score: float
    lm_score: float


# ---------------------------------------------------------------------------------------------- worked by hand
# Posteriors (columns blank, a, b), beam width 2, beam_prune_logp = ln 0.1 (drop beams below best / 10),
# token_min_logp = ln 0.09 (a frame's candidates: labels with p >= 0.09), no LM, p_b / p_nb as probabilities:
P = np.array([[0.5, 0.4, 0.1], [0.6, 0.05, 0.35], [0.2, 0.7, 0.1]])
BEAM, PRUNE, MIN_LP = 2, LN(0.1), LN(0.09)
# frame 0, candidates blank a b, from the root (empty prefix, p_b 1):
#   ""  p_b .5                                    total .5   kept
#   "a" p_nb .4                                   total .4   kept
#   "b" p_nb .1                                   total .1   pruned by the beam width (.1 >= .5 / 10)
# frame 1, candidates blank .6 and b .35 (a .05 < .09 is no candidate):
#   ""  p_b .5 x .6 = .30           (from "")     kept
#   "a" p_b .4 x .6 = .24           (from "a")    kept
#   "b" p_nb .5 x .35 = .175        (from "")     beam width
#   "ab" p_nb .4 x .35 = .14        (from "a")    beam width (threshold .03)
# frame 2, candidates blank .2, a .7, b .1; beams "" (p_b .30) and "a" (p_b .24, p_nb 0):
#   "a"  p_nb "" + a: .30 x .7 = .21; p_b "a" + blank: .24 x .2 = .048   total .258   kept, best row "" + a
#   "aa" p_nb "a" + a (after a blank): .24 x .7 = .168                   total .168   kept
#   ""   p_b .30 x .2 = .06                                              beam width
#   "b"  p_nb .30 x .1 = .03                                             beam width (threshold .0258)
#   "ab" p_nb .24 x .1 = .024                                            below the threshold .0258
# returned: "a" (ln .258), "aa" (ln .168).
# Each entry: text, source (index into the previous frame's kept beams), label added (-1: none), p_b, p_nb, merged
# rows, fate; the search ranks kept entries best first (pruned ones follow in any order).
HAND = [
    [
        ("", 0, -1, 0.5, 0.0, 1, "kept"),
        ("a", 0, 1, 0.0, 0.4, 1, "kept"),
        ("b", 0, 2, 0.0, 0.1, 1, "beam"),
    ],
    [
        ("", 0, -1, 0.30, 0.0, 1, "kept"),
        ("a", 1, -1, 0.24, 0.0, 1, "kept"),
        ("b", 0, 2, 0.0, 0.175, 1, "beam"),
        ("ab", 1, 2, 0.0, 0.14, 1, "beam"),
    ],
    [
        ("a", 0, 1, 0.048, 0.21, 2, "kept"),
        ("aa", 1, 1, 0.0, 0.168, 1, "kept"),
        ("", 0, -1, 0.06, 0.0, 1, "beam"),
        ("b", 0, 2, 0.0, 0.03, 1, "beam"),
        ("ab", 1, 2, 0.0, 0.024, 1, "threshold"),
    ],
]
HAND_CANDS = [[0, 1, 2], [0, 2], [0, 1, 2]]
HAND_HYPS = [("a", 0.258), ("aa", 0.168)]
FATE_CODE = {"kept": 0, "threshold": 1, "beam": 2, "history": 3}


def _ln(p: float) -> float:
    return LN(p) if p > 0 else NEG


def hand_snapshots(ids: dict[str, int]) -> list[FrameSnapshot]:
    """The worked frames as the search's snapshots (prefix ids from ``ids``, new texts get new ids)."""
    out = []
    for t, (rows, cands) in enumerate(zip(HAND, HAND_CANDS, strict=True)):
        for text, *_ in rows:
            ids.setdefault(text, len(ids))
        p_b = np.array([_ln(r[3]) for r in rows])
        p_nb = np.array([_ln(r[4]) for r in rows])
        out.append(
            FrameSnapshot(
                t=t,
                cand_labels=np.array(cands, np.int64),
                cand_lp=np.log(P[t, cands]),
                prefix=np.array([ids[r[0]] for r in rows], np.int64),
                source=np.array([r[1] for r in rows], np.int64),
                label=np.array([r[2] for r in rows], np.int64),
                ends_in_blank=p_nb == NEG,
                p_b=p_b,
                p_nb=p_nb,
                lm=np.zeros(len(rows)),
                total=np.logaddexp(p_b, p_nb),
                merged=np.array([r[5] for r in rows], np.int64),
                fate=np.array([FATE_CODE[r[6]] for r in rows], np.int8),
            )
        )
    return out


def hand_trace() -> CTCTrace:
    """The worked example recorded from hand-made snapshots (the recorder alone, no search)."""
    ids = {"": 0}
    snaps = hand_snapshots(ids)
    texts = {v: k for k, v in ids.items()}
    rec = CTCTraceRecorder(LABELS, BLANK)
    rec.begin(0, len(snaps), texts.__getitem__)
    for s in snaps:
        rec.frame(0, s)
    rec.end(0, [Hyp(t, LN(p), LN(p), 0.0) for t, p in HAND_HYPS], [ids[t] for t, _ in HAND_HYPS])
    return rec.traces()[0]


def assert_hand_numbers(trace: CTCTrace) -> None:
    """``trace`` holds exactly the worked entries: texts, sources, labels, p_b, p_nb, totals, fates (pruned
    entries compared as a set per frame, their order being free)."""
    assert len(trace.frames) == 3
    for t, rows in enumerate(HAND):
        f = trace.frames[t]
        assert sorted(c.label for c in f.candidates) == HAND_CANDS[t]
        assert len(f.entries) == len(rows), [e.text for e in f.entries]
        kept = [r for r in rows if r[6] == "kept"]
        assert [e.text for e in f.kept] == [r[0] for r in kept]  # kept first, best first
        by_text = {e.text: e for e in f.entries}
        for text, source, label, pb, pnb, _merged, fate in rows:
            e = by_text[text]
            assert (e.fate, e.label) == (fate, label), text
            if fate == "kept":
                assert e.source == source, text
            assert e.p_b == pytest.approx(_ln(pb), abs=1e-12) if pb else e.p_b == NEG
            assert e.p_nb == pytest.approx(_ln(pnb), abs=1e-12) if pnb else e.p_nb == NEG
            assert e.total == pytest.approx(LN(pb + pnb), abs=1e-12)
            assert e.lm == 0.0
    assert [(h.text, round(math.exp(h.logit_score), 12)) for h in trace.hypotheses] == HAND_HYPS
    assert [h.entries for h in trace.hypotheses] == [[0], [1]]


def test_recorder_keeps_the_worked_frames():
    trace = hand_trace()
    assert_hand_numbers(trace)
    f2 = trace.frames[2]
    assert [e.merged for e in f2.entries] == [2, 1, 1, 1, 1]
    assert [e.label_text for e in f2.entries] == ["a", "a", "", "b", "b"]
    assert trace.frames[0].candidates[0].text == "ε" and trace.label_text(2) == "b"
    assert trace.n_entries == 12


def test_recorder_refuses_frames_out_of_order_and_missing_frames():
    rec = CTCTraceRecorder(LABELS, BLANK)
    snaps = hand_snapshots({"": 0})
    rec.begin(0, 3, str)
    with pytest.raises(ValueError, match="frame 1 recorded after 0 frames"):
        rec.frame(0, snaps[1])
    rec.frame(0, snaps[0])
    with pytest.raises(ValueError, match="1 frames recorded, 3 announced"):
        rec.end(0, [], [])
    with pytest.raises(ValueError, match="blank index 3"):
        CTCTraceRecorder(LABELS, 3)
    with pytest.raises(TypeError, match="sequence of strings"):
        CTCTraceRecorder("ab", 0)


def test_greedy_is_the_best_path_of_the_posteriors():
    trace = hand_trace()
    assert trace.best_path() == np.argmax(P, axis=1).tolist() == [0, 0, 1]
    assert trace.greedy_labels == [1] and trace.greedy == "a"
    assert trace.greedy_prefixes() == ["", "", "a"]
    tied = CTCTrace.from_json(trace.to_json())
    for c in tied.frames[1].candidates:
        c.logprob = LN(0.5)  # blank and b tie at frame 1: numpy's argmax takes the lower id
    assert tied.best_path() == np.argmax([[0.5, 0.4, 0.1], [0.5, 0.0, 0.5], [0.2, 0.7, 0.1]], axis=1).tolist()
    assert collapse([1, 1, 0, 1, 2, 2, 0], 0) == [1, 1, 2]
    assert join_labels(["", "▁he", "llo", "▁w"], [1, 2, 3]) == "hello w"


def test_json_round_trip():
    trace = hand_trace()
    text = trace.to_json()
    raw = json.loads(text)
    assert raw["frames"][0]["entries"][0]["p_nb"] == "-inf" and raw["greedy"] == "a"
    back = CTCTrace.from_json(text)
    assert back == trace
    assert CTCTrace.from_json(raw) == trace


# ---------------------------------------------------------------------------------------------- drawings
def test_svg_has_one_node_per_entry_with_its_fate_and_an_edge_to_its_source():
    trace = hand_trace()
    svg = ET.fromstring(to_svg(trace))
    ns = "{http://www.w3.org/2000/svg}"
    nodes = [g for g in svg.iter(f"{ns}g") if "node" in g.get("class", "").split()]
    assert len(nodes) == trace.n_entries + 1  # and the root
    fates = [e.fate for f in trace.frames for e in f.entries]
    classes = [g.get("class", "").split() for g in nodes[1:]]
    assert [f"f-{fate}" in c for fate, c in zip(fates, classes, strict=True)] == [True] * len(fates)
    # parents: frame 0 from the root, later frames from the previous frame's kept entry named by `source`
    titles = {g.get("data-id"): g.find(f"{ns}title").text for g in nodes}  # type: ignore[union-attr]
    child = nodes[1 + 3 + 4]  # frame 2, entry 0: "a" from "" + a
    assert child.get("data-parent") == "4" and "\"\" + 'a'" in titles[child.get("data-id")]
    assert "p_b -3.0366" in titles["8"] and "2 extensions merged" in titles["8"]  # ln .048
    # the returned hypotheses' beams and their ancestors are marked; the greedy prefix "a" at frame 2 too
    result = {g.get("data-id") for g in nodes if "result" in g.get("class", "")}
    assert result == {"0", "1", "2", "4", "5", "8", "9"}
    assert {g.get("data-id") for g in nodes if "greedy" in g.get("class", "")} == {"0", "1", "4", "8"}
    edges = [p for p in svg.iter(f"{ns}path") if p.get("data-child")]
    assert len(edges) == trace.n_entries


def test_dot_draws_every_entry_and_edge():
    trace = hand_trace()
    dot = to_dot(trace)
    assert dot.startswith("digraph ctc_search {")
    assert sum(1 for line in dot.splitlines() if "[label=" in line) == trace.n_entries + 1
    assert sum(1 for line in dot.splitlines() if "->" in line) == trace.n_entries
    assert "n4 -> n8" in dot  # frame 2's "a" from frame 1's ""


def test_html_is_self_contained_and_carries_the_trace():
    trace = hand_trace()
    page = to_html(trace)
    offline = page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert page.startswith("<!DOCTYPE html>") and "http://" not in offline
    assert "https://" not in page and "compress runs of blank-only frames" in page
    assert to_html(trace, standalone=False).startswith('<div class="bk-view"')  # the Jupyter fragment
    with pytest.raises(TypeError, match="CTCTrace"):
        to_html(object())  # type: ignore[arg-type]


def _quiet_trace() -> CTCTrace:
    """Frames: a, then three blank-only frames, then b (the beams after 'a': "a" and "")."""
    ids = {"": 0, "a": 1, "b": 2, "ab": 3}
    rec = CTCTraceRecorder(LABELS, BLANK)
    rec.begin(0, 5, {v: k for k, v in ids.items()}.__getitem__)

    def snap(t, cands, rows):
        p_b = np.array([r[3] for r in rows], float)
        p_nb = np.array([r[4] for r in rows], float)
        return FrameSnapshot(
            t,
            np.array(cands),
            np.log([1.0] if len(cands) == 1 else [0.4, 0.6]),  # the last candidate is the frame's best
            np.array([ids[r[0]] for r in rows]),
            np.array([r[1] for r in rows]),
            np.array([r[2] for r in rows]),
            p_nb == NEG,
            p_b,
            p_nb,
            np.zeros(len(rows)),
            np.logaddexp(p_b, p_nb),
            np.ones(len(rows), np.int64),
            np.array([0] * len(rows), np.int8),
        )

    rec.frame(0, snap(0, [0, 1], [("a", 0, 1, NEG, -0.7), ("", 0, -1, -0.7, NEG)]))
    rec.frame(0, snap(1, [0], [("a", 0, -1, -0.7, NEG), ("", 1, -1, -0.7, NEG)]))  # the label end turns blank
    rec.frame(0, snap(2, [0], [("a", 0, -1, -0.7, NEG), ("", 1, -1, -0.7, NEG)]))  # quiet
    rec.frame(0, snap(3, [0], [("a", 0, -1, -0.7, NEG), ("", 1, -1, -0.7, NEG)]))  # quiet
    rec.frame(0, snap(4, [0, 2], [("ab", 0, 2, NEG, -1.4), ("b", 1, 2, NEG, -1.4)]))
    rec.end(0, [Hyp("ab", -1.4, -1.4, 0.0)], [3])
    return rec.traces()[0]


def test_blank_only_frames_are_compressed():
    trace = _quiet_trace()
    assert quiet_frames(trace) == [False, False, True, True, False]
    lay = ctc_layout(trace)
    assert lay.column["full"] == [112.0, 208.0, 304.0, 400.0, 496.0]
    assert lay.column["full-q"] == [112.0, 208.0, None, 304.0, 400.0]  # frame 2 folded into frame 3's column
    # frame 4's "ab" hangs, when compressed, under frame 3's "a" (its source chain through frame 2 hidden)
    ab = 1 + 2 * 4
    assert lay.nodes[ab].parent == 7 and lay.pos["full-q"][5] is None and lay.pos["full-q"][7] is not None
    svg = to_svg(trace)
    assert "(t 2-3: ε)" in svg
    assert lay.greedy_leaves is None and lay.result == lay.greedy == {0, 1, 3, 5, 7, ab}
    assert trace.greedy == "ab" == trace.hypotheses[0].text


# ---------------------------------------------------------------------------------------------- the real search
def traced(mats, labels, lm=None, **knobs):
    """The search of ``mats`` (log-probabilities taken as given, one (T, V) each; ``knobs``: CTCOptions' fields,
    ``split_blank`` off unless given) recorded by a :class:`Decoder`: its hypotheses, the same search's
    hypotheses from ``prefix_beam_search`` (no recorder), and the traces."""
    options = CTCOptions(**{"split_blank": False, **knobs})
    decoder = Decoder(labels, lm, options)
    mats = [np.asarray(m, dtype=np.float64) for m in mats]
    parts = (dense_part(m, options.token_min_logp, decoder.vocab.blank) for m in mats)
    cands = collect_candidates(parts, np.array([len(m) for m in mats], dtype=np.int64))
    recorder = CTCTraceRecorder(decoder.vocab.labels, decoder.vocab.blank)
    hyps = decoder.search_candidates(cands, recorder=recorder)
    plain = prefix_beam_search(mats, labels, options, lm=lm)
    return hyps, plain, recorder.traces()


def test_the_search_records_the_worked_example():
    hyps, _, (trace,) = traced([np.log(P)], LABELS, beam_width=BEAM, beam_prune_logp=PRUNE, token_min_logp=MIN_LP)
    assert_hand_numbers(trace)
    # rows merged: frame 2's "a" = "" + a and "a" + blank ("a" + a adds nothing: "a" has no alignment ending in a)
    assert [e.merged for e in trace.frames[2].entries[:2]] == [2, 1]
    assert [h.text for h in hyps[0]] == ["a", "aa"]


def _posteriors(rng, T, V, peak=2.5):
    """Log-probabilities of T frames over V labels, peaky (a random favourite per frame)."""
    x = rng.standard_normal((T, V)) * peak
    return x - np.logaddexp.reduce(x, axis=1, keepdims=True)


def _expand(kept, cands, blank):
    """One frame of prefix beam search by hand (no LM, beam unit = prefix): prefix labels -> [p_b, p_nb,
    contributions, best contribution, its beam, its label]."""
    out = {}

    def add(prefix, end, value, beam, label):
        if value == NEG:
            return
        e = out.setdefault(prefix, [NEG, NEG, 0, NEG, -1, -1])
        e[end] = np.logaddexp(e[end], value)
        e[2] += 1
        if value > e[3]:
            e[3:] = [value, beam, label]

    for j, (pre, pb, pnb) in enumerate(kept):
        for lab, lp in cands:
            if lab == blank:
                add(pre, 0, np.logaddexp(pb, pnb) + lp, j, -1)
            elif pre and pre[-1] == lab:
                add(pre, 1, pnb + lp, j, -1)
                add(pre + (lab,), 1, pb + lp, j, lab)
            else:
                add(pre + (lab,), 1, np.logaddexp(pb, pnb) + lp, j, lab)
    return out


CHARS = ["", "a", "b", "c"]


@pytest.mark.parametrize("seed", range(12))
def test_every_frame_equals_a_hand_expansion_of_the_previous_beams(seed):
    rng = np.random.default_rng(seed)
    T, beam = int(rng.integers(1, 7)), int(rng.integers(1, 5))
    lp = _posteriors(rng, T, len(CHARS))
    prune, min_lp = float(-rng.uniform(1, 8)), float(-rng.uniform(1, 6))
    hyps, plain, (trace,) = traced([lp], CHARS, beam_width=beam, beam_prune_logp=prune, token_min_logp=min_lp)
    code = {c: i for i, c in enumerate(CHARS)}
    kept = [((), 0.0, NEG)]
    for t, f in enumerate(trace.frames):
        # candidates: lp >= token_min_logp, or the argmax alone when none is
        want = [i for i in range(len(CHARS)) if lp[t, i] >= min_lp] or [int(np.argmax(lp[t]))]
        assert sorted(c.label for c in f.candidates) == want
        cands = [(c.label, lp[t, c.label]) for c in f.candidates]
        expected = _expand(kept, cands, 0)
        got = {tuple(code[ch] for ch in e.text): e for e in f.entries}
        assert set(got) == set(expected), t
        for pre, (pb, pnb, n, _, beam_j, lab) in expected.items():
            e = got[pre]
            assert e.p_b == pytest.approx(pb, abs=1e-9) and e.p_nb == pytest.approx(pnb, abs=1e-9), (t, pre)
            assert (e.merged, e.source, e.label) == (n, beam_j, lab), (t, pre)
            assert e.total == pytest.approx(np.logaddexp(pb, pnb), abs=1e-9) and e.lm == 0.0
        # fates: below best + beam_prune_logp is the threshold's; the best `beam` of the rest are kept
        totals = sorted((e.total for e in f.entries), reverse=True)
        floor = totals[0] + prune
        n_kept = min(beam, sum(1 for x in totals if x >= floor))
        assert [e.total for e in f.kept] == pytest.approx(totals[:n_kept])
        for e in f.entries[n_kept:]:
            assert e.fate == ("threshold" if e.total < floor else "beam")
        kept = [(tuple(code[ch] for ch in e.text), e.p_b, e.p_nb) for e in f.kept]
    assert _texts(hyps[0]) == _texts(plain[0])


def _texts(hyps):
    return [(h.text, round(h.score, 9)) for h in hyps]


@pytest.mark.parametrize("seed", range(16))
def test_trace_properties_on_random_inputs(seed):
    """Split beam units, history pruning, several utterances: what the trace says the search kept is what it
    returned."""
    rng = np.random.default_rng(100 + seed)
    labels = ["", "a", "b", " "]
    mats = [_posteriors(rng, int(rng.integers(0, 8)), len(labels)) for _ in range(int(rng.integers(1, 4)))]
    knobs = dict(
        beam_width=int(rng.integers(1, 5)),
        beam_prune_logp=float(-rng.uniform(1, 10)),
        token_min_logp=float(-rng.uniform(1, 6)),
        split_blank=bool(rng.integers(2)),
        prune_history=bool(rng.integers(2)),
    )
    hyps, plain, traces = traced(mats, labels, **knobs)
    assert len(traces) == len(mats) and [t.utterance for t in traces] == list(range(len(mats)))
    for m, h, p, trace in zip(mats, hyps, plain, traces, strict=True):
        assert len(trace.frames) == m.shape[0]
        assert _texts(h) == _texts(p)  # tracing changes nothing
        prev_kept = 1
        for f in trace.frames:
            assert 1 <= len(f.kept) <= knobs["beam_width"]
            assert all(0 <= e.source < prev_kept for e in f.entries)  # pruned entries are never sources
            for e in f.kept:
                assert e.total == pytest.approx(np.logaddexp(e.p_b, e.p_nb) + e.lm, abs=1e-9)
            if not knobs["split_blank"]:
                assert all(e.ends_in_blank == (e.p_nb == NEG) for e in f.entries)
            if not knobs["prune_history"]:
                assert all(e.fate != "history" for e in f.entries)
            prev_kept = len(f.kept)
        assert [x.text for x in trace.hypotheses] == [x.text for x in h]
        last = trace.frames[-1].kept if trace.frames else []
        for x in trace.hypotheses:
            if trace.frames:
                assert x.entries == [j for j, e in enumerate(last) if e.prefix == x.prefix] != []
                # the final ranking sums the last beams whose text reads the same (split beam units included)
                same = [e.logit for e in last if " ".join(e.text.split()) == x.text]
                assert x.logit_score == pytest.approx(np.logaddexp.reduce(same), abs=1e-9)
            assert " ".join(x.prefix_text.split()) == x.text
        assert CTCTrace.from_json(trace.to_json()) == trace


def _brute_force(lp, labels):
    """log P(text) summed over every label path of the matrix (T x V small)."""
    T, V = lp.shape
    totals = {}
    for path in itertools.product(range(V), repeat=T):
        text = join_labels(labels, collapse(path, 0))
        totals[text] = np.logaddexp(totals.get(text, NEG), sum(lp[t, k] for t, k in enumerate(path)))
    return totals


@pytest.mark.parametrize("seed", range(8))
def test_best_hypothesis_equals_brute_force_without_pruning(seed):
    rng = np.random.default_rng(200 + seed)
    T = int(rng.integers(1, 5))
    lp = _posteriors(rng, T, len(CHARS))
    exact = _brute_force(lp, CHARS)
    hyps, _, (trace,) = traced([lp], CHARS, beam_width=len(CHARS) ** T, beam_prune_logp=NEG, token_min_logp=NEG)
    best = max(exact, key=exact.__getitem__)
    assert trace.hypotheses[0].text == best == hyps[0][0].text
    for h in trace.hypotheses:
        assert h.logit_score == pytest.approx(exact[h.text], abs=1e-9)
    assert len(trace.hypotheses) == len(exact)


def test_lm_scores_are_recorded():
    from beamkit.ctc import LanguageModelFusion
    from beamkit.lm import ArpaLM, build_arpa

    rng = np.random.default_rng(7)
    labels = ["", "a", "b", " "]
    lm = LanguageModelFusion(ArpaLM.from_lines(build_arpa(["a b", "b a", "a a b"] * 3, order=2).splitlines()))
    lp = _posteriors(rng, 9, len(labels), peak=1.5)
    hyps, plain, (trace,) = traced([lp], labels, lm=lm, beam_width=4, split_blank=True)
    assert _texts(hyps[0]) == _texts(plain[0])
    lms = [e.lm for f in trace.frames for e in f.entries]
    assert any(x != 0.0 for x in lms)
    for f in trace.frames:
        for e in f.entries:
            assert e.total == pytest.approx(np.logaddexp(e.p_b, e.p_nb) + e.lm, abs=1e-9)
            if not e.text.strip():
                assert e.lm == 0.0  # no word yet: nothing scored
    best = trace.hypotheses[0]
    assert best.score == pytest.approx(best.logit_score + best.lm_score)


# ---------------------------------------------------------------------------------------------- beamkit ctc explain
CLI_LABELS = ["", " ", "a", "b", "c", "t"]


@pytest.fixture
def ctc_cli(monkeypatch, capsys, tmp_path):
    """Run ``beamkit`` with only the CTC commands: (exit code, stdout, stderr); and the input files: a labels
    file and a (2, T, V) .npy of peaky log-probabilities spelling "a cat" / "at a" with some doubt."""
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("beamkit.cli.ctc",))
    rng = np.random.default_rng(5)
    mats = []
    for text in ("a cat", "at a "):
        path = [k for ch in text for k in (CLI_LABELS.index(ch),) * 2 + (0,) * 3]
        lp = np.log(rng.dirichlet(np.full(len(CLI_LABELS), 0.5), size=len(path)) * 0.3)
        lp[np.arange(len(path)), path] = math.log(0.7)
        mats.append(lp - np.logaddexp.reduce(lp, axis=1, keepdims=True))
    (tmp_path / "labels.txt").write_text("\n".join(["", "<space>", *CLI_LABELS[2:]]) + "\n")
    np.save(tmp_path / "lp.npy", np.stack(mats))
    np.save(tmp_path / "one.npy", mats[0])

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        rc = cli.main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return rc, out, err

    return run, tmp_path


@pytest.mark.parametrize("with_lm", [False, True])
def test_ctc_explain_json_is_the_search_ctc_decode_ran(ctc_cli, with_lm):
    from beamkit.lm import build_arpa

    run, d = ctc_cli
    labels: tuple = ("--labels", d / "labels.txt")
    if with_lm:
        (d / "lm.arpa").write_text(build_arpa(["a cat", "at a cat", "a bat"] * 3, order=2))
        labels += ("--lm", d / "lm.arpa", "--lm-backend", "arpa")
    for utt in (0, 1):
        rc, out, err = run("ctc", "explain", d / "lp.npy", *labels, "--utterance", utt, "--beam", 4, "--format", "json")
        assert rc == 0, err
        trace = CTCTrace.from_json(out)
        assert len(trace.frames) == 25 and trace.source == f"lp.npy [{utt}]"
        rc, out, _ = run("ctc", "decode", d / "lp.npy", *labels, "--beam", 4, "--json", "--top", 4)
        beams = json.loads(out.splitlines()[utt])["beams"]
        assert [(h.text, h.score) for h in trace.hypotheses] == [(b["text"], b["score"]) for b in beams]
        rc, out, _ = run("ctc", "decode", d / "lp.npy", *labels[:2], "--greedy")  # best path: no LM
        assert trace.greedy == out.splitlines()[utt]
        assert any(e.lm != 0.0 for f in trace.frames for e in f.entries) == with_lm


@pytest.mark.parametrize("fmt", ["html", "svg", "dot"])
def test_ctc_explain_drawings(ctc_cli, fmt):
    run, d = ctc_cli
    out_file = d / f"search.{fmt}"
    rc, out, err = run("ctc", "explain", d / "one.npy", "--labels", d / "labels.txt", "--format", fmt, "-o", out_file)
    assert rc == 0 and err == "", err
    rc, raw, _ = run("ctc", "explain", d / "one.npy", "--labels", d / "labels.txt", "--format", "json")
    trace = CTCTrace.from_json(raw)
    assert f"wrote {out_file}: {trace.n_entries} entries over 25 frames; best: 'a cat'" in out
    text = out_file.read_text(encoding="utf-8")
    if fmt == "dot":
        assert sum(1 for line in text.splitlines() if "[label=" in line) == trace.n_entries + 1
    else:
        assert text.count('<g class="node ') == trace.n_entries + 1
        assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")


@pytest.mark.parametrize(
    "args, needle",
    [
        (("--beam", "0"), "argument --beam: expected an integer from 1 to 100,000, got 0"),
        (("--utterance", "2"), "--utterance must lie in [0, 1]"),
        (("--token-min-logp", "1"), "argument --token-min-logp: expected <= 0"),
        (("--blank", "9"), "blank index 9 out of range"),
        (("--alphabet", "_abc", "--blank", "0"), "but the vocabulary has 4 labels"),
    ],
)
def test_ctc_explain_usage_errors_are_one_line_and_exit_2(ctc_cli, capsys, args, needle):
    run, d = ctc_cli
    labels = () if "--alphabet" in args else ("--labels", d / "labels.txt")
    try:
        rc, out, err = run("ctc", "explain", d / "lp.npy", *labels, *args)
    except SystemExit as stop:  # an option's type refused it (argparse: usage line, then the error)
        rc, (out, err) = int(stop.code or 0), capsys.readouterr()
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert needle in lines[-1] and (len(lines) == 1 or lines[0].startswith("usage:")), err
    rc, _, err = run("ctc", "explain", d / "missing.npy", "--labels", d / "labels.txt")
    assert rc == 2 and err.strip() == f"beamkit ctc: error: no such file: {d / 'missing.npy'}"


def test_ctc_explain_argparse_errors_exit_2(ctc_cli, capsys):
    run, d = ctc_cli
    with pytest.raises(SystemExit) as stop:
        run("ctc", "explain", d / "lp.npy", "--labels", d / "labels.txt", "--format", "png")
    assert stop.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.endswith("invalid choice: 'png' (choose from 'html', 'svg', 'dot', 'json')")


def test_ctc_explain_help_describes_every_option():
    parser = cli.build_parser()
    sub = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    exp = sub["ctc"]._subparsers._group_actions[0].choices["explain"]  # type: ignore[union-attr]
    flat = " ".join(exp.format_help().split())
    assert exp.description and "one column per frame" in flat and "one label per line" in flat
    for action in exp._actions:
        assert action.help, action.dest
    assert "(default: 10)" in flat and "{html,svg,dot,json}" in flat and "(default: html)" in flat


# ---------------------------------------------------------------------------------------------- in a browser
def browser_trace() -> CTCTrace:
    """The search's trace of "a cat" spoken with doubt between letters and long silences (runs of blank-only
    frames), split beam units, beam 4."""
    rng = np.random.default_rng(11)
    path = [0] * 4 + [2, 2, 0, 1, 1, 0, 0, 0, 0, 4, 4, 0, 2, 0, 5, 5] + [0] * 5
    lp = np.log(rng.dirichlet(np.full(len(CLI_LABELS), 0.5), size=len(path)) * 0.2)
    lp[np.arange(len(path)), path] = np.log(0.8)
    lp[[0, 1, 2, 3, 10, 11, 21, 22, 23, 24], 1:] = np.log(0.001)  # silence: blank alone is a candidate
    lp -= np.logaddexp.reduce(lp, axis=1, keepdims=True)
    _, _, (trace,) = traced([lp], CLI_LABELS, beam_width=4, split_blank=True, token_min_logp=-4.0)
    return trace


@pytest.mark.slow
def test_ctc_page_in_headless_chromium(tmp_path):
    from tests.test_viz_browser import VISIBLE, assert_clean_offline_load, hover, open_page

    trace = browser_trace()
    quiet = quiet_frames(trace)
    hidden = sum(len(f.entries) for t, f in enumerate(trace.frames[:-1]) if quiet[t] and quiet[t + 1])
    kept = sum(len(f.kept) for f in trace.frames)
    assert hidden > 0 and kept < trace.n_entries and trace.hypotheses[0].text == "a cat"
    with open_page(tmp_path, to_html(trace)) as (dt, page):
        nodes = dt.evaluate("document.querySelectorAll('svg.bk-tree g.node').length")
        rendered = dt.evaluate("document.querySelector('.bk-view').getAttribute('data-rendered')")
        assert nodes == trace.n_entries + 1 and rendered == str(nodes)  # every entry and the root; script ran
        assert dt.evaluate(f"{VISIBLE}.length") == nodes - hidden  # quiet runs compressed by default
        edges = "[...document.querySelectorAll('path.edge')].filter(p => getComputedStyle(p).display !== 'none')"
        dt.evaluate("document.querySelector('input.quiet').click()")
        assert dt.evaluate(f"{VISIBLE}.length") == nodes
        assert dt.evaluate(f"{edges}.length") == nodes - 1  # an edge to every entry, redrawn by the script
        dt.evaluate("document.querySelector('input.fold').click()")
        assert dt.evaluate(f"{VISIBLE}.length") == kept + 1
        assert dt.evaluate(f"{edges}.length") == kept
        # the redrawn edge of the last frame's first entry ends at that entry's box
        first = trace.n_entries - len(trace.frames[-1].entries) + 1
        end = dt.evaluate(
            f"document.querySelector('path.edge[data-child=\"{first}\"]').getAttribute('d').split(' ').pop()"
        )
        box = dt.evaluate(f"document.querySelector('g.node[data-id=\"{first}\"]').getAttribute('transform')")
        x, y = (float(v) for v in box[len("translate(") : -1].split(","))
        assert [float(v) for v in end.split(",")] == [x, y + 17 / 2]
        last = trace.n_entries  # the last frame's last entry
        e = trace.frames[-1].entries[-1]
        info = hover(dt, last)
        assert f"p_nb {e.p_nb:.4f}" in info and f"total {e.total:.4f}" in info and "merged" in info
        assert_clean_offline_load(dt, page)
