"""beamkit.ctc.Decoder: named hypotheses equal to the pyctcdecode drop-in's tuples (the same search) and to a
brute-force sum over alignments; bad input named; CTCOptions checked; a bad utterance keeps the others'
results; the old names warn."""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest

import beamkit.ctc.compat as compat
from beamkit.ctc import CTCBatchDecodeError, CTCHypothesis, CTCOptions, Decoder, Vocabulary, fusion_of
from beamkit.lm import ArpaLM, build_arpa
from tests.ctc_legacy import build_legacy_decoder as build_ctcdecoder
from tests.test_ctc_prefix_search import oracle

LABELS = ["", " ", "a", "b", "c"]
CORPUS = ["a b", "ab ba", "b a c", "a c", "c ab", "ab"] * 3


def frames(rng: np.random.Generator, T: int, V: int = len(LABELS)) -> np.ndarray:
    """Random per-frame log-probabilities (Dirichlet rows)."""
    return np.log(rng.dirichlet(np.full(V, 0.6), size=T))


def test_hypotheses_equal_the_compat_tuples_field_by_field() -> None:
    rng = np.random.default_rng(3)
    mats = [frames(rng, int(rng.integers(4, 12))) for _ in range(5)]
    lm = ArpaLM.from_lines(build_arpa(CORPUS, order=2).splitlines())
    peer = compat.build_ctcdecoder(LABELS)
    native = Decoder(LABELS, options=CTCOptions(beam_width=16, pyctcdecode_compat=True), input_kind="log_probs")
    got = native.decode(mats)
    want = peer.decode_beams_batch(None, mats, beam_width=16)
    assert len(got) == len(want) == len(mats)
    # the drop-in re-normalises the log-probabilities (pyctcdecode's rule): scores agree to rounding
    for hyps, beams in zip(got, want, strict=True):
        assert all(isinstance(h, CTCHypothesis) for h in hyps)
        assert [(h.text, h.word_frames) for h in hyps] == [(b[0], b[1]) for b in beams]
        assert [h.logit_score for h in hyps] == pytest.approx([b[2] for b in beams], abs=1e-12)
        assert [h.score for h in hyps] == pytest.approx([b[3] for b in beams], abs=1e-12)
    one = peer.decode_beams(mats[0], beam_width=16)
    assert [(h.text, h.lm_state, h.word_frames) for h in got[0]] == [b[:3] for b in one]
    assert [h.score for h in got[0]] == pytest.approx([b[4] for b in one], abs=1e-12)
    with_lm = Decoder(LABELS, lm, CTCOptions(beam_width=8))
    hyps = with_lm.decode(mats[1])[0]
    assert all(h.lm_score == pytest.approx(h.score - h.logit_score) for h in hyps)
    assert all(h.lm_state is not None for h in hyps)


@pytest.mark.parametrize("seed", range(4))
def test_wide_beam_equals_the_brute_force_alignment_sum(seed: int) -> None:
    rng = np.random.default_rng(seed)
    labels = ["", "a", "b"]
    lp = frames(rng, int(rng.integers(1, 5)), V=3)  # T <= 4, V = 3: 81 alignments at most
    want = oracle(lp, labels, 0)
    opts = CTCOptions(beam_width=100, beam_prune_logp=-math.inf, token_min_logp=-math.inf)
    (hyps,) = Decoder(labels, options=opts, input_kind="log_probs").decode([lp])
    assert {h.text for h in hyps} == set(want)
    for h in hyps:
        assert h.logit_score == pytest.approx(want[h.text], abs=1e-9)
        assert h.score == h.logit_score and h.lm_score == 0.0
    assert [h.text for h in hyps][0] == max(want, key=want.__getitem__)
    best = np.argmax(lp, axis=1)  # the best path by hand: argmax per frame, collapse, drop blanks
    text = "".join(labels[k] for i, k in enumerate(best) if k != 0 and (i == 0 or best[i - 1] != k))
    assert Decoder(labels, input_kind="log_probs").greedy(lp) == [text]


def test_trace_is_the_search_decode_ran() -> None:
    rng = np.random.default_rng(7)
    mats = [frames(rng, 6), frames(rng, 4)]
    dec = Decoder(LABELS, options=CTCOptions(beam_width=5), input_kind="log_probs")
    traces = dec.trace(mats)
    assert [len(t.frames) for t in traces] == [6, 4]
    for trace, hyps in zip(traces, dec.decode(mats), strict=True):
        assert [(h.text, h.score) for h in trace.hypotheses] == [(h.text, h.score) for h in hyps]


def test_a_bad_utterance_keeps_the_others() -> None:
    rng = np.random.default_rng(11)
    good = [frames(rng, 5), frames(rng, 7)]
    bad = np.full((4, len(LABELS)), np.nan)
    dec = Decoder(LABELS, input_kind="log_probs")
    alone = [dec.decode([m])[0] for m in good]
    with pytest.raises(CTCBatchDecodeError) as caught:
        dec.decode([good[0], bad, good[1]])
    assert set(caught.value.errors) == {1} and "NaN" in caught.value.errors[1]
    assert caught.value.results == [alone[0], [], alone[1]]
    with pytest.raises(CTCBatchDecodeError, match="utterance 1: .*vocabulary has 5 labels"):
        dec.greedy([good[0], np.zeros((3, 3))])


@pytest.mark.parametrize(
    "call, error, needle",
    [
        (lambda: Decoder("abc"), TypeError, "vocab must be"),
        (lambda: Decoder(LABELS, lm="lm.arpa"), TypeError, "lm must be"),
        (lambda: Decoder(LABELS, options={"beam_width": 3}), TypeError, "options must be a CTCOptions"),
        (
            lambda: Decoder(LABELS, input_kind="logit"),
            ValueError,
            "input_kind must be .auto., .logits., .log_probs. or",
        ),
        (lambda: Decoder(["a", "b"]), ValueError, "blank"),
        (lambda: Decoder(LABELS).decode(np.zeros(5)), ValueError, "logits must be one"),
        (lambda: Decoder(LABELS).decode(np.zeros((1, 2, 3, 4))), ValueError, "logits must be one"),
        (lambda: Decoder(LABELS).decode(np.zeros((3, 4))), CTCBatchDecodeError, "vocabulary has 5 labels"),
    ],
)
def test_bad_input_names_the_problem(call, error, needle) -> None:
    with pytest.raises(error, match=needle):
        call()


@pytest.mark.parametrize(
    "field, value, error",
    [
        ("beam_width", 0, ValueError),
        ("beam_width", 2.5, TypeError),
        ("beam_width", True, TypeError),
        ("beam_prune_logp", 0.5, ValueError),
        ("beam_prune_logp", math.nan, ValueError),
        ("token_min_logp", "low", TypeError),
        ("prune_history", 1, TypeError),
        ("hotwords", "cat", TypeError),
        ("hotwords", ["cat", 3], TypeError),
        ("hotword_weight", math.inf, ValueError),
        ("num_hypotheses", 0, ValueError),
        ("word_frames", None, TypeError),
    ],
)
def test_options_are_checked(field, value, error) -> None:
    with pytest.raises(error, match=field if field != "hotwords" else "hotwords"):
        CTCOptions(**{field: value})


def test_options_accept_the_limits_and_keep_hotwords_as_a_tuple() -> None:
    opts = CTCOptions(beam_prune_logp=-math.inf, token_min_logp=0.0, hotwords=["ab", "c"], num_hypotheses=3)
    assert opts.hotwords == ("ab", "c") and opts.out_k == 3
    with pytest.raises(AttributeError):
        opts.beam_width = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "module, name",
    [
        ("beamkit.ctc", "CTCDecoder"),
        ("beamkit.ctc", "build_ctcdecoder"),
        ("beamkit.ctc", "greedy_decode"),
        ("beamkit.ctc", "ArpaLM"),
        ("beamkit.ctc", "HotwordScorer"),
        ("beamkit.ctc", "log_softmax"),
        ("beamkit.ctc.lm", "kenlm_available"),
        ("beamkit.ctc.decoder", "OutputBeam"),
        ("beamkit.ctc.options", "SearchOptions"),
        ("beamkit.viz.ctc", "describe"),
        ("beamkit.ctc.search", "Recorder"),
        ("beamkit.ctc.posteriors", "Candidates"),
    ],
)
def test_old_names_are_gone(module, name) -> None:
    """Each name has one import path: the earlier names are AttributeErrors, not forwards."""
    mod = importlib.import_module(module)
    with pytest.raises(AttributeError, match=f"has no attribute '{name}'"):
        getattr(mod, name)


@pytest.mark.parametrize("module", ["beamkit.ctc.kneser_ney", "beamkit.ngram", "beamkit.ctc.compat.legacy"])
def test_old_modules_are_gone(module) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(module)


def test_the_tests_tuple_front_end_decodes_as_the_native_one() -> None:
    rng = np.random.default_rng(5)
    mats = [frames(rng, 6) for _ in range(3)]
    old = build_ctcdecoder(LABELS)
    assert old.vocab.labels == LABELS and old.language_model is None
    assert old.pyctcdecode_compat is False and old.input_kind == "auto"
    beams = old.decode_beams_batch(None, mats, beam_width=8)
    hyps = Decoder(LABELS, options=CTCOptions(beam_width=8)).decode(mats)
    assert beams == [[(h.text, h.word_frames, h.logit_score, h.score) for h in u] for u in hyps]


# ------------------------------------------------------------------------------- the first compilation, said aloud
class _FakeIndex:
    def __init__(self, path, entries) -> None:
        self._index_path = str(path)
        self._entries = entries

    def _load_index(self):
        return self._entries


class _FakeDispatcher:
    """What :func:`beamkit.ctc.jit.is_cold` reads of a numba dispatcher: compiled signatures and the cache index."""

    def __init__(self, signatures, path, entries) -> None:
        from types import SimpleNamespace

        self.signatures = signatures
        self._cache = SimpleNamespace(_cache_file=_FakeIndex(path, entries))


def test_a_cold_compiled_cache_is_recognised(tmp_path, monkeypatch) -> None:
    from beamkit.ctc import jit

    monkeypatch.setattr(jit, "COMPILED", True)
    index = tmp_path / "run_frames.nbi"
    assert jit.is_cold(_FakeDispatcher([], index, {}))  # no index file: never compiled here
    index.write_bytes(b"x")
    assert jit.is_cold(_FakeDispatcher([], index, {}))  # an index of another source version loads empty
    assert not jit.is_cold(_FakeDispatcher([], index, {("sig",): "data"}))  # compiled code on disk
    assert not jit.is_cold(_FakeDispatcher([("sig",)], tmp_path / "none", {}))  # compiled in this process
    assert not jit.is_cold(object())  # a layout it does not know: nothing untrue is said


def test_the_compiled_cache_follows_every_module_of_the_search(tmp_path) -> None:
    # numba checks a compiled function's own file only, and the frame loops hold the code of helpers from other
    # modules (the candidates' merging, the hash tables): after an upgrade that changed a helper alone, the cache
    # on disk gave the old code. Every cached function of the search now also carries a digest of all its modules.
    from beamkit.ctc import jit
    from beamkit.ctc.lexicon import kernel

    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    before = jit.sources_stamp.__wrapped__(tmp_path)
    assert jit.sources_stamp.__wrapped__(tmp_path) == before  # the same sources, the same digest
    (tmp_path / "sub" / "b.py").write_text("y = 3\n")
    changed = jit.sources_stamp.__wrapped__(tmp_path)
    assert changed != before  # a helper's change alone is seen
    (tmp_path / "sub" / "b.py").rename(tmp_path / "sub" / "c.py")
    assert jit.sources_stamp.__wrapped__(tmp_path) != changed  # so is a module renamed
    if not jit.COMPILED:
        pytest.skip("numba is not installed: nothing is compiled or cached")
    for dispatcher in (kernel.run_lexicon_frames, kernel.backtrace):
        stamp = dispatcher._cache._cache_file._source_stamp
        assert stamp[1] == jit.sources_stamp(jit.SOURCES)


def test_the_first_decode_on_a_cold_cache_says_it_compiles_once(monkeypatch, capsys) -> None:
    # the first decode after an install compiled for 20-60 s and printed nothing
    from beamkit.ctc import jit

    cold = {"now": True}
    monkeypatch.delenv("BEAMKIT_COMPILE_NOTE", raising=False)  # the test suite keeps the note quiet elsewhere
    monkeypatch.setattr(jit, "is_cold", lambda dispatcher: cold["now"])
    monkeypatch.setattr(jit, "_noted", False)
    monkeypatch.setattr(jit, "_asked", set())
    dec = Decoder(["", " ", "a", "b"])
    lp = np.log(np.full((4, 4), 0.25))
    dec.decode(lp)
    dec.decode(lp)
    err = capsys.readouterr().err
    assert err.count("compiling the CTC search once") == 1, err  # one line, once per process
    assert err.strip() == jit.COLD_NOTE
    monkeypatch.setattr(jit, "_noted", False)
    cold["now"] = False
    dec.decode(lp)
    assert capsys.readouterr().err == ""  # a warm cache: nothing printed
    monkeypatch.setenv("BEAMKIT_COMPILE_NOTE", "0")
    monkeypatch.setattr(jit, "_noted", False)
    cold["now"] = True
    dec.decode(lp)
    assert capsys.readouterr().err == ""  # silenced


def test_each_search_says_it_compiles_when_it_is_the_cold_one(monkeypatch, capsys) -> None:
    # the note was asked once per process: a lexicon search compiling after a prefix search had run was silent
    from beamkit.ctc import LexiconDecoder, jit

    cold: set[int] = set()
    monkeypatch.delenv("BEAMKIT_COMPILE_NOTE", raising=False)
    monkeypatch.setattr(jit, "is_cold", lambda dispatcher: id(dispatcher) in cold)
    monkeypatch.setattr(jit, "_noted", False)
    monkeypatch.setattr(jit, "_asked", set())
    lp = np.log(np.full((4, 4), 0.25))
    Decoder(["", " ", "a", "b"]).decode(lp)  # the prefix search: warm
    lexicon = LexiconDecoder(["-", "|", "a", "b"])
    cold.add(id(lexicon.search._run.k.run_lexicon_frames))  # the lexicon search: cold
    lexicon.decode(lp.astype(np.float32))
    lexicon.decode(lp.astype(np.float32))
    assert capsys.readouterr().err.strip() == jit.COLD_NOTE


def test_two_decoders_share_no_search_state() -> None:
    # decoders over one Vocabulary object with other LMs, labels and hotwords, their calls interleaved utterance by
    # utterance, each give what each gives alone; two decoders of one LM fusion object each ask the LM for the
    # words they score (each keeps its own scored words); freeing one decoder's storage leaves the other's
    rng = np.random.default_rng(21)
    vocab = Vocabulary.from_labels(LABELS)
    mats = [frames(rng, int(rng.integers(6, 14))) for _ in range(6)]
    lm_ab = fusion_of(ArpaLM.from_lines(build_arpa(CORPUS, order=2).splitlines()), alpha=0.8)
    lm_c = fusion_of(ArpaLM.from_lines(build_arpa(["c c", "c a c", "b c", "cab c"] * 3, order=3).splitlines()))
    setups = [
        (vocab, lm_ab, CTCOptions(beam_width=8)),
        (vocab, lm_c, CTCOptions(beam_width=8, hotwords=("cab",), hotword_weight=4.0)),
        (["", " ", "c", "b", "a"], lm_ab, CTCOptions(beam_width=8, prune_history=True)),  # other letters, same width
    ]

    def rows(hyps: list[list[CTCHypothesis]]) -> list[list[tuple]]:
        return [[(h.text, h.score, h.logit_score, h.word_frames) for h in hs] for hs in hyps]

    alone = [rows(Decoder(v, lm, o, input_kind="log_probs").decode(mats)) for v, lm, o in setups]
    assert alone[0] != alone[1] and alone[0] != alone[2] and alone[1] != alone[2]
    decoders = [Decoder(v, lm, o, input_kind="log_probs") for v, lm, o in setups]
    for m, mat in enumerate(mats):
        for i, decoder in enumerate(decoders):
            assert rows(decoder.decode([mat])) == [alone[i][m]], (m, i)

    asked: list[int] = []
    fusion = fusion_of(ArpaLM.from_lines(build_arpa(CORPUS, order=2).splitlines()))
    score_words = fusion.score_words
    fusion.score_words = lambda states, words: (asked.append(len(words)), score_words(states, words))[1]  # type: ignore[method-assign]
    first, second = (Decoder(LABELS, fusion, CTCOptions(beam_width=8), input_kind="log_probs") for _ in range(2))
    want = rows(first.decode(mats))
    n_first = sum(asked)
    assert n_first > 0
    assert rows(first.decode(mats)) == want and sum(asked) == n_first  # its own scored words, kept
    assert rows(second.decode(mats)) == want and sum(asked) == 2 * n_first  # none of the first's
    third = first.with_lm(fusion)  # starts from the first's label tables (read-only), nothing else
    assert rows(third.decode(mats)) == want and sum(asked) == 3 * n_first
    assert third._caches._labels is first._caches._labels
    assert first.release_cached_memory() > 0
    assert second.release_cached_memory() > 0  # still there: its storage is its own
    assert third.release_cached_memory() > 0
    assert first.release_cached_memory() == 0
