"""Both CTC searches with an ARPA model read from its compiled arrays (``beamkit.ctc.ngram``) inside the compiled loop:
the same hypotheses as the searches asking the model in Python (the existing path, an independent computation of
every LM score: kenlm's own, to the bit, where kenlm is installed; beamkit's Python ARPA reader otherwise, to
float32 rounding), on random utterances and fusion settings; and no Python LM call while decoding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from beamkit.ctc import CTCOptions, Decoder, LanguageModelFusion, LexiconDecoder, LexiconOptions
from beamkit.ctc.lexicon.lm import KenLMWords, NGramWords
from beamkit.ctc.prefix import fusion as prefix_fusion
from beamkit.lm import ArpaLM, KenLMModel, build_arpa, kenlm_available

LABELS = ["", " ", "a", "b", "c", "t"]
BPE = ["<pad>", "\u2581a", "\u2581b", "\u2581ca", "t", "b", "\u2581"]
CORPUS = ["a cat", "cat bat", "a b c", "bat a cat", "cab at", "tab cat a", "at bat"] * 3
TOKENS = ["-", "|", "a", "b", "c", "t"]


class PythonModel:
    """A model in Python (the searches ask it through their Python path): the wrapped model's answers."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.order = inner.order

    def begin_state(self) -> Any:
        return self.inner.begin_state()

    def null_state(self) -> Any:
        return self.inner.null_state()

    def score(self, state: Any, word: str) -> tuple[float, Any]:
        return self.inner.score(state, word)

    def eos_score(self, state: Any) -> float:
        return self.inner.eos_score(state)

    def __contains__(self, word: object) -> bool:
        return word in self.inner


@pytest.fixture
def arpa(tmp_path: Path) -> str:
    path = tmp_path / "lm.arpa"
    path.write_text(build_arpa(CORPUS, order=3), encoding="utf-8")
    return str(path)


def reference_model(arpa: str) -> tuple[Any, bool]:
    """The model the Python path asks, and whether its scores are KenLM's (then equal to the bit)."""
    if kenlm_available():
        return KenLMModel(arpa), True
    return ArpaLM.from_file(arpa), False


def utterances(seed: int, n: int, V: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.log(rng.dirichlet(np.full(V, 0.4), size=int(rng.integers(3, 25)))) for _ in range(n)]


SETTINGS = [
    ({}, {}),
    ({"alpha": 0.9, "beta": -0.5, "unk_score_offset": -4.0}, {"prune_history": True}),
    ({"score_boundary": False}, {"pyctcdecode_compat": True}),
    ({"alpha": 0.0}, {"hotwords": ["cat"], "split_blank": True}),
    ({"unk_score_offset": float("-inf")}, {"pyctcdecode_compat": True, "prune_history": True}),
]


@pytest.mark.parametrize("fusion_args, options", SETTINGS)
@pytest.mark.parametrize("labels", [LABELS, BPE], ids=["chars", "bpe"])
def test_prefix_search_equals_the_python_lm_path(arpa: str, fusion_args: dict, options: dict, labels: list) -> None:
    model, exact = reference_model(arpa)
    unigrams = ["a", "cat", "bat", "cab"] if fusion_args.get("alpha") == 0.9 else None
    compiled = LanguageModelFusion(model, unigrams or ArpaLM.from_file(arpa).words(), **fusion_args)
    python = LanguageModelFusion(PythonModel(model), unigrams or ArpaLM.from_file(arpa).words(), **fusion_args)
    assert compiled.arrays_model() is not None and python.arrays_model() is None
    opts = CTCOptions(beam_width=12, **options)
    mats = utterances(7, 12, len(labels))
    got = Decoder(labels, compiled, opts, input_kind="log_probs").decode(mats)
    want = Decoder(labels, python, opts, input_kind="log_probs").decode(mats)
    for g, w in zip(got, want, strict=True):
        same = [(h.text, h.word_frames, h.logit_score) for h in w]
        assert [(h.text, h.word_frames, h.logit_score) for h in g] == same
        if exact:  # KenLM's float32 scores, the same operations: the same numbers
            assert [(h.score, h.lm_state) for h in g] == [(h.score, h.lm_state) for h in w]
        else:  # the Python reader sums in float64: ~1e-7 of each word's log10 score, times alpha * ln 10
            assert [h.score for h in g] == pytest.approx([h.score for h in w], rel=1e-6, abs=1e-5)


def counted(monkeypatch: pytest.MonkeyPatch, owner: type, names: list[str], calls: list[str]) -> None:
    for name in names:
        real = getattr(owner, name)

        def wrapper(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            calls.append(f"{owner.__name__}.{_name}")
            return _real(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)


def test_the_prefix_search_asks_python_nothing_while_decoding(arpa: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = reference_model(arpa)
    decoder = Decoder(LABELS, LanguageModelFusion(model, None), CTCOptions(beam_width=16), input_kind="log_probs")
    decoder.decode(utterances(1, 1, len(LABELS)))  # the set-up (label tables, the word table) is done once
    calls: list[str] = []
    counted(monkeypatch, type(model), ["score", "score_many", "eos_score", "eos_many"], calls)
    counted(monkeypatch, LanguageModelFusion, ["score_word", "score_words", "score_eos", "score_eos_many"], calls)
    counted(monkeypatch, prefix_fusion.Fusion, ["resolve"], calls)
    counted(monkeypatch, prefix_fusion.LMCache, ["store", "eos_scores"], calls)
    # the hypotheses' LM state objects are read back after the search (the model's own states): left out here
    monkeypatch.setattr(prefix_fusion.LMCache, "state_of", lambda self, sid: sid)
    got = decoder.decode(utterances(2, 20, len(LABELS)))
    assert sum(len(h) for h in got) > 0 and any(" " in h[0].text for h in got if h)  # words were completed
    assert calls == []
    # the same probe finds the calls of the Python path
    python = LanguageModelFusion(PythonModel(model))
    decoder = Decoder(LABELS, python, CTCOptions(beam_width=16), input_kind="log_probs")
    counted(monkeypatch, PythonModel, ["score"], calls)
    decoder.decode(utterances(2, 3, len(LABELS)))
    assert "PythonModel.score" in calls and "Fusion.resolve" in calls


def lexicon_file(tmp_path: Path) -> str:
    path = tmp_path / "lexicon.txt"
    path.write_text("".join(f"{w} {' '.join(w)} |\n" for w in ["a", "cat", "bat", "cab", "at", "tab"]))
    return str(path)


def emissions(seed: int, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.normal(size=(int(rng.integers(4, 30)), len(TOKENS))) * 2.0
        out.append((x - np.log(np.exp(x).sum(-1, keepdims=True))).astype(np.float32))
    return out


def plain(hyps: list[Any]) -> list[tuple]:
    return [(h.tokens.tolist(), list(h.words), float(h.score), h.timesteps.tolist()) for h in hyps]


@pytest.mark.parametrize("lexicon", [True, False], ids=["lexicon", "lexicon-free"])
def test_lexicon_search_equals_kenlm_through_python(arpa: str, tmp_path: Path, lexicon: bool) -> None:
    kenlm = pytest.importorskip("kenlm")
    options = LexiconOptions(nbest=5, beam_size=8, lm_weight=1.5, word_score=0.3, unk_score=-3.0, log_add=lexicon)
    if lexicon:
        lex, lm_dict = lexicon_file(tmp_path), None
    else:  # a token-level LM: the tokens file is the LM's word list (the words of the model are the tokens)
        lm_path = tmp_path / "chars.arpa"
        lm_path.write_text(build_arpa([" ".join(s.replace(" ", "|")) for s in CORPUS], order=4), encoding="utf-8")
        arpa = str(lm_path)
        lex, lm_dict = None, str(tmp_path / "tokens.txt")
        Path(lm_dict).write_text("\n".join(TOKENS) + "\n")
    compiled = LexiconDecoder(TOKENS, lex, arpa, options, lm_dict=lm_dict)
    assert isinstance(compiled.search.lm, NGramWords)
    words = [compiled.word_dict.get_entry(i) for i in range(compiled.word_dict.index_size())]
    python = LexiconDecoder(TOKENS, lex, KenLMWords(kenlm.Model(arpa), words), options, lm_dict=lm_dict)
    for em in emissions(3, 12):
        assert plain(compiled.decode(em)[0]) == plain(python.decode(em)[0])


def test_lexicon_search_asks_python_nothing_while_decoding(
    arpa: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoder = LexiconDecoder(TOKENS, lexicon_file(tmp_path), arpa, LexiconOptions(nbest=3, beam_size=8))
    calls: list[str] = []
    counted(monkeypatch, NGramWords, ["start", "score", "finish"], calls)
    got = [decoder.decode(em)[0] for em in emissions(4, 10)]
    assert any(h and h[0].words for h in got) and calls == []


def test_a_token_the_lm_dictionary_lacks_is_refused(arpa: str, tmp_path: Path) -> None:
    # lexicon-free, a token is scored as the LM dictionary's word of its index: a dictionary shorter than the
    # tokens is an error naming the index (the compiled loop must not read past the word list)
    short = tmp_path / "short.txt"
    short.write_text("\n".join(TOKENS[:3]) + "\n")
    decoder = LexiconDecoder(TOKENS, None, arpa, LexiconOptions(beam_size=4), lm_dict=str(short))
    with pytest.raises(ValueError, match="word index 5 is out of range for the LM's 3 words"):
        decoder.decode(emissions(5, 1)[0])


@pytest.mark.parametrize("lexicon", [True, False], ids=["lexicon", "lexicon-free"])
def test_with_a_compiled_model_a_frame_makes_states_only_for_the_hypotheses_it_keeps(
    arpa: str, tmp_path: Path, lexicon: bool
) -> None:
    # each scored transition went into the state table (lexicon-free with a character model: ~57,000 states an
    # utterance on the benchmark, a table far past the CPU caches); the score of a transition is read from its
    # parent's n-gram state, and only the states the beam keeps need an entry (and an n-gram state)
    kenlm = pytest.importorskip("kenlm")
    frames = 40
    options = LexiconOptions(nbest=3, beam_size=6, lm_weight=1.5, word_score=0.3, unk_score=-3.0)
    if lexicon:
        lex, lm_dict = lexicon_file(tmp_path), None
    else:
        lm_path = tmp_path / "chars.arpa"
        lm_path.write_text(build_arpa([" ".join(s.replace(" ", "|")) for s in CORPUS], order=4), encoding="utf-8")
        arpa = str(lm_path)
        lex, lm_dict = None, str(tmp_path / "tokens.txt")
        Path(lm_dict).write_text("\n".join(TOKENS) + "\n")
    compiled = LexiconDecoder(TOKENS, lex, arpa, options, lm_dict=lm_dict)
    words = [compiled.word_dict.get_entry(i) for i in range(compiled.word_dict.index_size())]
    python = LexiconDecoder(TOKENS, lex, KenLMWords(kenlm.Model(arpa), words), options, lm_dict=lm_dict)
    rng = np.random.default_rng(11)
    x = rng.normal(size=(frames, len(TOKENS))) * 0.5  # flat frames: many candidates a frame, few kept
    em = (x - np.log(np.exp(x).sum(-1, keepdims=True))).astype(np.float32)
    run, kept = compiled.search._run, set()
    compiled.begin()
    for t in range(frames):  # frame by frame, the LM states each new beam holds
        compiled.step(em[t : t + 1])
        kept.update(run.beam.lm[: int(run.beam.size[0])].tolist())
    compiled.end()  # and the states after </s> the final beam holds
    kept.update(run.beam.lm[: int(run.beam.size[0])].tolist())
    got = plain(compiled.hypotheses())
    kept.discard(0)  # the start state is no entry of the table
    assert kept and int(run.table.meta[0]) == len(kept)  # one a candidate scored: several times as many
    assert got == plain(python.decode(em)[0])


@pytest.mark.parametrize("lexicon", [True, False], ids=["lexicon", "lexicon-free"])
def test_decoding_goes_on_after_the_end_of_sentence_as_through_python(arpa: str, tmp_path: Path, lexicon: bool) -> None:
    # steps after end() go on from the hypotheses' states after </s> (as torchaudio's decode_step after
    # decode_end): the compiled model's states after </s> must exist, with their n-gram state, as kenlm's do
    kenlm = pytest.importorskip("kenlm")
    options = LexiconOptions(nbest=4, beam_size=6, lm_weight=1.2, word_score=0.2, unk_score=-3.0)
    lex = lexicon_file(tmp_path) if lexicon else None
    lm_dict = None
    if not lexicon:
        lm_dict = str(tmp_path / "tokens.txt")
        Path(lm_dict).write_text("\n".join(TOKENS) + "\n")
        lm_path = tmp_path / "chars.arpa"
        lm_path.write_text(build_arpa([" ".join(s.replace(" ", "|")) for s in CORPUS], order=4), encoding="utf-8")
        arpa = str(lm_path)
    compiled = LexiconDecoder(TOKENS, lex, arpa, options, lm_dict=lm_dict)
    words = [compiled.word_dict.get_entry(i) for i in range(compiled.word_dict.index_size())]
    python = LexiconDecoder(TOKENS, lex, KenLMWords(kenlm.Model(arpa), words), options, lm_dict=lm_dict)
    first, second = emissions(9, 2)
    got = []
    for decoder in (compiled, python):
        decoder.begin()
        decoder.step(first)
        decoder.end()
        decoder.step(second)
        decoder.end()
        got.append(plain(decoder.hypotheses()))
    assert got[0] and got[0] == got[1]


def test_a_fusion_made_again_over_the_same_words_shares_their_set_and_follows_a_changed_list(arpa: str) -> None:
    model = ArpaLM.from_file(arpa)
    words = ["cat", "bat", "dog", "a"]  # "dog" is not a word of the model: dropped
    first, again = LanguageModelFusion(model, words), LanguageModelFusion(model, list(words))
    assert first.unigrams == {"cat", "bat", "a"}  # by hand from CORPUS
    assert again.unigrams is first.unigrams  # the tables keyed by it are found without comparing every word
    assert again.prefix_index is first.prefix_index
    words.append("tab")  # the caller's list changed: the known words follow it
    changed = LanguageModelFusion(model, words)
    assert changed.unigrams == {"cat", "bat", "a", "tab"}
    other = LanguageModelFusion(ArpaLM.from_file(arpa), ["cat", "bat", "dog", "a"])  # another model: its own set
    assert other.unigrams == {"cat", "bat", "a"} and other.unigrams is not first.unigrams
    assert changed.prefix_index is not None and changed.prefix_index.has_prefix("ta")
    assert first.prefix_index is not None and not first.prefix_index.has_prefix("ta")
