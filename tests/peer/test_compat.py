"""``beamkit.ctc.compat`` against pyctcdecode 0.5.0: the same programs, run with each module, give the same
outputs and raise the same exception types. Runs in ``.venv-peer`` (see test_ctc_pyctcdecode.py)."""

from __future__ import annotations

import inspect
import logging
import math
import multiprocessing as mp
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

pyctcdecode = pytest.importorskip("pyctcdecode")
kenlm = pytest.importorskip("kenlm")

from test_ctc_pyctcdecode import LABELS, WORDS, utterances  # noqa: E402

import beamkit.ctc.compat as compat  # noqa: E402
from beamkit.lm import build_arpa  # noqa: E402

logging.getLogger("pyctcdecode").setLevel(logging.ERROR)
logging.getLogger("beamkit").setLevel(logging.ERROR)

MODULES = {"pyctcdecode": pyctcdecode, "beamkit": compat}


def outcome(fn: Callable[[Any], Any], module: Any) -> Any:
    """``fn(module)``'s value, or the name of the exception type it raised."""
    try:
        return fn(module)
    except Exception as exc:  # noqa: BLE001 - the type is the outcome under comparison
        return ("raised", type(exc).__name__)


def rounded(beams: Any, nd: int = 6, frames: bool = True) -> Any:
    """Beams with floats rounded, LM states dropped (compared through the scores) and word frames cut to
    (word, start frame): the end frame of a word can differ where several alignments of one text tie in
    the beam (beamkit keeps the best alignment's; see the README). ``frames=False`` drops the frames (with
    history pruning, pyctcdecode's frames come from whichever alignment its pruning kept)."""
    out = []
    for beam in beams:
        items = []
        for x in beam:
            if isinstance(x, float):
                items.append(round(x, nd))
            elif isinstance(x, str):
                items.append(x)
            elif frames and isinstance(x, list) and (not x or isinstance(x[0], tuple)):
                items.append([(word, frames[0]) for word, frames in x])
        out.append(tuple(items))
    return out


def same(fn: Callable[[Any], Any]) -> Any:
    """Run ``fn`` with both modules; assert equal outcomes; return pyctcdecode's."""
    want = outcome(fn, pyctcdecode)
    got = outcome(fn, compat)
    assert got == want
    return want


@pytest.fixture(scope="module")
def arpa(tmp_path_factory) -> str:
    rng = np.random.default_rng(1)
    corpus = [" ".join(rng.choice(WORDS, size=int(rng.integers(2, 7)))) for _ in range(300)]
    path = tmp_path_factory.mktemp("lm") / "lm.arpa"
    path.write_text(build_arpa(corpus, order=3))
    return str(path)


def test_constants_and_names() -> None:
    for name in pyctcdecode.constants.__dict__:
        if name.isupper():
            assert getattr(compat.constants, name) == getattr(pyctcdecode.constants, name), name
    for name in ("BPE_TOKEN", "UNK_TOKEN", "UNK_BPE_TOKEN"):
        assert getattr(compat.alphabet, name) == getattr(pyctcdecode.alphabet, name)
    for module in ("alphabet", "constants", "decoder", "language_model"):
        peer = getattr(pyctcdecode, module)
        names = [
            n
            for n in vars(peer)
            if not n.startswith("_")
            and (inspect.isclass(vars(peer)[n]) or inspect.isfunction(vars(peer)[n]))
            and vars(peer)[n].__module__ == peer.__name__
        ]
        for name in names + ["Alphabet", "BeamSearchDecoderCTC", "build_ctcdecoder", "LanguageModel"]:
            assert hasattr(getattr(compat, module), name) or hasattr(compat, name), (module, name)


def test_decoding_without_lm() -> None:
    mats = utterances(3, 12)
    probs = [np.exp(m) for m in mats[:4]]
    raw = [m * 3.0 + 1.0 for m in mats[:4]]  # logits (not log-probabilities): a log-softmax is applied

    def program(m: Any) -> Any:
        dec = m.build_ctcdecoder(LABELS)
        return (
            [dec.decode(x) for x in mats + probs + raw],
            [rounded(dec.decode_beams(x, beam_width=20)) for x in mats[:5]],
            [rounded(dec.decode_beams(x, prune_history=True, token_min_logp=-8.0), frames=False) for x in mats[5:8]],
            dec.decode_batch(None, mats),
            [rounded(b) for b in dec.decode_beams_batch(None, mats[:4], beam_width=10)],
            [dec.decode(x, hotwords=["cat", " black "], hotword_weight=4.0) for x in mats],
        )

    same(program)


def test_decoding_with_lm_reset_and_hotwords(arpa: str) -> None:
    mats = utterances(2, 15)

    def program(m: Any) -> Any:
        dec = m.build_ctcdecoder(LABELS, kenlm_model_path=arpa)
        first = [dec.decode(x) for x in mats]
        beams = [rounded(dec.decode_beams(x, beam_width=16)) for x in mats[:6]]
        dec.reset_params(alpha=0.9, beta=0.5, unk_score_offset=-4.0, lm_score_boundary=False)
        second = [dec.decode(x, hotwords=["black", "rat"]) for x in mats]
        batch = [rounded(b, frames=False) for b in dec.decode_beams_batch(None, mats[:5], prune_history=True)]
        return first, beams, second, batch

    same(program)


def test_language_model_object(arpa: str) -> None:
    model = kenlm.Model(arpa)
    unigrams = sorted(set(WORDS[:14]))

    def program(m: Any) -> Any:
        lm = m.LanguageModel(model, unigrams, alpha=0.7, beta=1.1, unk_score_offset=-6.0)
        out: list[Any] = [lm.order, lm.alpha, lm.beta, lm.unk_score_offset, lm.score_boundary]
        out += [lm.score_partial_token(p) for p in ["", "c", "ca", "bla", "zz", "catxxxxxx", "thexxxxxxx"]]
        for boundary in (True, False):
            lm.reset_params(score_boundary=boundary)
            state = lm.get_start_state()
            for word in ["the", "cat", "zebra", "sat", ""]:
                score, state = lm.score(state, word)
                out.append(round(score, 9))
            out.append(round(lm.score(state, "mat", is_last_word=True)[0], 9))
        lm.reset_params(alpha=0.2, beta=-1.0, unk_score_offset=-2.0)
        out.append(round(lm.score(lm.get_start_state(), "dog")[0], 9))
        return out

    same(program)
    no_unigrams = same(lambda m: [m.LanguageModel(model).score_partial_token(p) for p in ["", "ca", "zz"]])
    assert no_unigrams == [-10.0, -10.0, -10.0]


def test_multi_language_model(arpa: str, tmp_path) -> None:
    other = tmp_path / "other.arpa"
    rng = np.random.default_rng(7)
    other.write_text(build_arpa([" ".join(rng.choice(WORDS, size=4)) for _ in range(200)], order=2))
    unigrams = sorted(set(WORDS))
    mats = utterances(5, 8)

    def program(m: Any) -> Any:
        lms = [
            m.LanguageModel(kenlm.Model(arpa), unigrams, alpha=0.6),
            m.LanguageModel(kenlm.Model(str(other)), unigrams, alpha=0.3, unk_score_offset=-5.0),
        ]
        multi = m.language_model.MultiLanguageModel(lms)
        state = multi.get_start_state()
        s1, state = multi.score(state, "cat")
        s2, _ = multi.score(state, "sat", is_last_word=True)
        dec = m.BeamSearchDecoderCTC(m.Alphabet.build_alphabet(LABELS), multi)
        return (
            multi.order,
            round(s1, 9),
            round(s2, 9),
            multi.score_partial_token("bla"),
            [dec.decode(x) for x in mats],
            [rounded(dec.decode_beams(x, beam_width=12)) for x in mats[:3]],
        )

    same(program)
    same(lambda m: m.language_model.MultiLanguageModel([m.LanguageModel(kenlm.Model(arpa))]))


ALPHABETS = [
    ["<pad>", "<s>", "</s>", "<unk>", "|", *"ETAONIHSRDLUMWCFGYPBVK'XJQZ"],  # wav2vec2
    ["", " ", *"abc"],
    [" ", *"abc", "_"],  # '_' becomes the blank
    [" ", *"abc"],  # blank appended
    ["<pad>", "<unk>", "▁the", "▁cat", "s", "at"],
    ["[PAD]", "[UNK]", "the", "##s", "cat", "##at"],  # WordPiece
    ["", "▁a", "▁a"],  # duplicates
    ["", "▁a", "b c"],  # space in BPE
    ["", "<UNK>", "[unk]", " ", "a"],
]


@pytest.mark.parametrize("labels", ALPHABETS)
def test_alphabet(labels: list[str]) -> None:
    def program(m: Any) -> Any:
        alphabet = m.Alphabet.build_alphabet(labels)
        again = m.Alphabet.loads(alphabet.dumps())
        return alphabet.labels, alphabet.is_bpe, alphabet.dumps(), again.labels, again.is_bpe

    same(program)
    same(lambda m: m.Alphabet.loads('{"labels": ["a"], "is_bpe": false, "x": 1}'))


def unk_matrix(labels: list[str], path: list[str], rng: np.random.Generator) -> np.ndarray:
    """Log-probabilities peaked on ``path`` (labels by name, "" for blank) over the normalised alphabet."""
    cols = {lab: i for i, lab in enumerate(labels)}
    probs = rng.dirichlet(np.ones(len(labels)), size=len(path)) * 0.05
    for t, lab in enumerate(path):
        probs[t, cols[lab]] += 0.9
    return np.log(probs / probs.sum(axis=1, keepdims=True))


def test_unknown_token_text() -> None:
    rng = np.random.default_rng(0)
    chars = ["<pad>", "<unk>", "|", *"abc"]
    path = ["a", "b", "", "|", "<unk>", "", "|", "c", "a"]
    norm = pyctcdecode.Alphabet.build_alphabet(chars).labels
    mat = unk_matrix(norm, [norm[chars.index(p)] if p else "" for p in path], rng)
    text = same(lambda m: m.build_ctcdecoder(chars).decode(mat))
    assert text == "ab ⁇ ca"
    same(lambda m: rounded(m.build_ctcdecoder(chars).decode_beams(mat), frames=False))
    # pyctcdecode puts the start of "⁇" on the blank after it (frame 5); the label is at frame 4
    assert compat.build_ctcdecoder(chars).decode_beams(mat)[0][2] == [("ab", (0, 2)), ("⁇", (4, 5)), ("ca", (7, 9))]
    bpe = ["<pad>", "<unk>", "▁ab", "▁c", "a"]
    norm = pyctcdecode.Alphabet.build_alphabet(bpe).labels
    mat = unk_matrix(norm, ["▁ab", "", "▁⁇▁", "", "▁c", "a"], rng)
    assert same(lambda m: m.build_ctcdecoder(bpe).decode(mat)) == "ab ⁇ ca"


def test_hotword_scorer() -> None:
    def program(m: Any) -> Any:
        scorer = m.language_model.HotwordScorer.build_scorer(["black cat", " rat ", "", "ca"], weight=3.0)
        empty = m.language_model.HotwordScorer.build_scorer(None)
        texts = ["the black cat", "cat catalog rat", "blackcat", "ca ca", ""]
        parts = ["", "b", "bla", "c", "ca", "cat", "x", "rat"]
        return (
            [scorer.score(t) for t in texts],
            [round(scorer.score_partial_token(p), 9) for p in parts],
            [p in scorer for p in parts],
            [empty.score(t) for t in texts],
            [empty.score_partial_token(p) for p in parts],
        )

    same(program)


def test_unigram_loader(arpa: str, tmp_path) -> None:
    same(lambda m: sorted(m.language_model.load_unigram_set_from_arpa(arpa)))
    bad = tmp_path / "none.arpa"
    bad.write_text("\\data\\\nngram 1=0\n\n\\1-grams:\n\n\\end\\\n")
    same(lambda m: m.language_model.load_unigram_set_from_arpa(str(bad)))


def test_fuzzed_parameter_resets(arpa: str) -> None:
    """Random reset sequences (right and wrong types): same exception types, same decodes after each."""
    rng = np.random.default_rng(11)
    mats = utterances(9, 3)
    values: list[Any] = [None, 0.0, 0.3, 1.7, -2.5, 2, True, "0.5", [0.1]]
    bools: list[Any] = [None, True, False, 1, 0.0, "yes"]
    for _ in range(25):
        resets = [
            {
                "alpha": values[rng.integers(len(values))],
                "beta": values[rng.integers(len(values))],
                "unk_score_offset": values[rng.integers(len(values))],
                "lm_score_boundary": bools[rng.integers(len(bools))],
            }
            for _ in range(3)
        ]

        def program(m: Any, resets: list[dict[str, Any]] = resets) -> Any:
            dec = m.build_ctcdecoder(LABELS, kenlm_model_path=arpa)
            lm_free = m.build_ctcdecoder(LABELS)
            out = []
            for params in resets:
                out.append(outcome(lambda _m, p=params: dec.reset_params(**p), m))
                out.append(outcome(lambda _m, p=params: lm_free.reset_params(**p), m))
                out.append([dec.decode(x) for x in mats])
            return out

        same(program)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 1e308])
def test_any_float_weight_is_taken_as_pyctcdecode_takes_it(arpa: str, bad: float) -> None:
    """pyctcdecode takes any float weight, in the constructor, ``reset_params`` and attribute assignment; so
    does the drop-in (a NaN or an infinity logs a warning: the scores are meaningless). beamkit's own
    LanguageModelFusion keeps refusing them (tests/test_ctc_compat.py)."""
    model = kenlm.Model(arpa)
    for name in ("alpha", "beta", "unk_score_offset"):
        same(lambda m, n=name: type(m.LanguageModel(model, **{n: bad})).__name__)
        same(lambda m, n=name: m.build_ctcdecoder(LABELS, kenlm_model_path=arpa).reset_params(**{n: bad}))
        same(lambda m, n=name: type(m.build_ctcdecoder(LABELS, kenlm_model_path=arpa, **{n: bad})).__name__)


@pytest.mark.parametrize("name", ["alpha", "beta"])
def test_a_nan_weight_fails_the_decode_as_in_pyctcdecode(arpa: str, name: str) -> None:
    """A NaN alpha or beta leaves no beam to rank: a ValueError in both (the drop-in names the weight)."""
    x = utterances(1, 1)[0]
    same(lambda m: m.build_ctcdecoder(LABELS, kenlm_model_path=arpa, **{name: math.nan}).decode_beams(x))


def test_invalid_logits() -> None:
    V = len(LABELS)
    bad = [
        np.zeros(V),
        np.zeros((2, 3, V)),
        np.zeros((4, V + 1)),
        np.zeros((4, V - 1)),
        np.zeros((0, V)),
        [[0.0] * V] * 3,  # not an array: AttributeError in both
    ]
    for frame, col, value in [(3, 5, math.nan), (3, slice(None), -math.inf), (2, 2, math.inf)]:
        x = utterances(3, 1)[0].copy()
        x[frame, col] = value
        bad.append(x)
        bad.append(x.astype(np.float32))
    for x in bad:
        same(lambda m, x=x: m.build_ctcdecoder(LABELS).decode(x))
        same(lambda m, x=x: rounded(m.build_ctcdecoder(LABELS).decode_beams(x)))
        same(lambda m, x=x: m.build_ctcdecoder(LABELS).decode_batch(None, [utterances(1, 1)[0], x]))


class CountingPool:
    """A stand-in fork pool that counts ``map`` calls (and maps in this process)."""

    def __init__(self) -> None:
        self._ctx = mp.get_context("fork")
        self.calls = 0

    def map(self, fn: Callable[[Any], Any], items: Any) -> list[Any]:
        self.calls += 1
        return [fn(x) for x in items]


def test_pool_is_used(arpa: str) -> None:
    mats = utterances(4, 6)
    want = pyctcdecode.build_ctcdecoder(LABELS, kenlm_model_path=arpa).decode_batch(None, mats)
    dec = compat.build_ctcdecoder(LABELS, kenlm_model_path=arpa)
    pool = CountingPool()
    assert dec.decode_batch(pool, mats) == want
    beams = dec.decode_beams_batch(pool, mats, beam_width=8)
    assert pool.calls == 2
    assert rounded(beams[0]) == rounded(dec.decode_beams_batch(None, mats, beam_width=8)[0])
    with mp.get_context("fork").Pool(2) as real:
        assert dec.decode_batch(real, mats) == want
    with mp.get_context("spawn").Pool(1) as spawn:  # not usable (no model_container there): decoded in turn
        assert dec.decode_batch(spawn, mats) == want


def test_streaming_lm_start_state(arpa: str) -> None:
    """Chunks decoded in turn, each starting from the previous chunk's best LM state."""
    mats = utterances(6, 6)

    def program(m: Any) -> Any:
        dec = m.build_ctcdecoder(LABELS, kenlm_model_path=arpa)
        texts, state = [], None
        for x in mats:
            beams = dec.decode_beams(x, lm_start_state=state)
            texts.append((beams[0][0], round(beams[0][4], 6), dec.decode(x, lm_start_state=state)))
            state = beams[0][1]
        return texts

    got = same(program)
    fresh = [compat.build_ctcdecoder(LABELS, kenlm_model_path=arpa).decode_beams(x)[0][4] for x in mats[1:]]
    assert [round(f, 6) for f in fresh] != [t[1] for t in got[1:]]  # the state changes the scores


@pytest.mark.parametrize("with_lm", [False, True])
@pytest.mark.parametrize(
    "writer,reader", [("pyctcdecode", "beamkit"), ("beamkit", "pyctcdecode"), ("beamkit", "beamkit")]
)
def test_save_and_load_interoperate(arpa: str, tmp_path, with_lm: bool, writer: str, reader: str) -> None:
    mats = utterances(8, 6)
    kwargs: dict[str, Any] = {"kenlm_model_path": arpa, "alpha": 0.8, "beta": 0.7} if with_lm else {}
    saved = MODULES[writer].build_ctcdecoder(["<pad>", "<unk>", "|", *"abcdefghijklmnopqrstuvwxyz'-"], **kwargs)
    saved.save_to_dir(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == (["alphabet.json", "language_model"] if with_lm else ["alphabet.json"])
    if with_lm:
        assert sorted(os.listdir(tmp_path / "language_model")) == ["attrs.json", "lm.arpa", "unigrams.txt"]
    cls = MODULES[reader].BeamSearchDecoderCTC
    files = cls.parse_directory_contents(str(tmp_path))
    assert files == pyctcdecode.BeamSearchDecoderCTC.parse_directory_contents(str(tmp_path))
    loaded = cls.load_from_dir(str(tmp_path))
    V = len(saved._alphabet.labels)
    mats = [np.pad(x, ((0, 0), (0, V - x.shape[1])), constant_values=-30.0) for x in mats]
    assert [loaded.decode(x) for x in mats] == [saved.decode(x) for x in mats]
    assert loaded._alphabet.labels == saved._alphabet.labels
    (tmp_path / "extra.txt").write_text("x")
    same(lambda m: m.BeamSearchDecoderCTC.parse_directory_contents(str(tmp_path)))
    same(lambda m: m.BeamSearchDecoderCTC.load_from_dir(str(tmp_path)) and None)


def test_load_from_hf_hub_local_directory(tmp_path) -> None:
    pyctcdecode.build_ctcdecoder(LABELS).save_to_dir(str(tmp_path))
    loaded = compat.BeamSearchDecoderCTC.load_from_hf_hub(str(tmp_path))
    mats = utterances(2, 3)
    assert [loaded.decode(x) for x in mats] == [pyctcdecode.build_ctcdecoder(LABELS).decode(x) for x in mats]


def test_model_container_and_cleanup(arpa: str) -> None:
    def program(m: Any) -> Any:
        cls = m.BeamSearchDecoderCTC
        cls.clear_class_models()
        a = m.build_ctcdecoder(LABELS, kenlm_model_path=arpa)
        b = m.build_ctcdecoder(LABELS)
        n = len(cls.model_container)
        a.cleanup()
        left = len(cls.model_container)
        b.cleanup()
        b.cleanup()  # twice: no error
        cls.clear_class_models()
        return n, left, len(cls.model_container), outcome(lambda _m: a.decode(utterances(1, 1)[0]), m)

    same(program)


def test_language_model_directory_both_ways(arpa: str, tmp_path) -> None:
    for writer, reader in [("pyctcdecode", "beamkit"), ("beamkit", "pyctcdecode")]:
        where = tmp_path / writer
        where.mkdir()
        lm = MODULES[writer].LanguageModel(kenlm.Model(arpa), WORDS[:10], alpha=0.4, beta=2.0, score_boundary=False)
        lm.save_to_dir(str(where))
        loaded = MODULES[reader].LanguageModel.load_from_dir(str(where))
        assert (loaded.alpha, loaded.beta, loaded.unk_score_offset, loaded.score_boundary) == (0.4, 2.0, -10.0, False)
        start = loaded.get_start_state()
        assert loaded.score(start, "cat")[0] == pytest.approx(lm.score(lm.get_start_state(), "cat")[0], abs=1e-9)
        assert [loaded.score_partial_token(p) for p in ["ca", "zz"]] == [
            lm.score_partial_token(p) for p in ["ca", "zz"]
        ]
    (tmp_path / "beamkit" / "stray.txt").write_text("x")
    same(lambda m: m.LanguageModel.load_from_dir(str(tmp_path / "beamkit")))


def test_hotword_scorer_from_a_pygtrie(arpa: str) -> None:
    import re

    import pygtrie

    def program(m: Any) -> Any:
        scorer = m.language_model.HotwordScorer(
            re.compile(r"(?<!\S)cat(?!\S)"), pygtrie.CharTrie.fromkeys(["cat"]), 2.5
        )
        return scorer.score("a cat cat"), scorer.score_partial_token("ca"), "c" in scorer, "x" in scorer

    same(program)


def test_abstract_and_custom_language_models(arpa: str) -> None:
    same(lambda m: m.language_model.AbstractLanguageModel())

    def program(m: Any) -> Any:
        lms = [m.LanguageModel(kenlm.Model(arpa), WORDS), m.LanguageModel(kenlm.Model(arpa), WORDS, alpha=0.2)]
        multi = m.language_model.MultiLanguageModel(lms)
        dec = m.BeamSearchDecoderCTC(m.Alphabet.build_alphabet(LABELS), multi)
        dec.reset_params(alpha=3.0)  # no effect on a MultiLanguageModel in pyctcdecode
        return [dec.decode(x) for x in utterances(12, 4)], outcome(lambda _m: multi.save_to_dir("unused"), m)

    same(program)

    class Custom(compat.language_model.AbstractLanguageModel):
        order = 2

        def get_start_state(self) -> Any:
            return None

        def score_partial_token(self, partial_token: str) -> float:
            return 0.0

        def score(self, prev_state: Any, word: str, is_last_word: bool = False) -> tuple[float, Any]:
            return 0.0, None

    with pytest.raises(TypeError, match="Custom is not supported"):
        compat.BeamSearchDecoderCTC(compat.Alphabet.build_alphabet(LABELS), Custom())
