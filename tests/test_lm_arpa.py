"""ARPA reader (KenLM back-off semantics), Kneser-Ney builder, and the kenlm cross-check."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from beamkit.ctc import LanguageModelFusion, UnigramPrefixIndex
from beamkit.ctc.lm import Hotwords
from beamkit.lm import (
    ArpaLM,
    KenLMModel,
    build_arpa,
    kenlm_available,
    load_language_model,
    load_unigrams_from_arpa,
    write_arpa,
)

HAND_ARPA = """\\data\\
ngram 1=5
ngram 2=2

\\1-grams:
-1.0\t<s>\t-0.5
-2.0\t<unk>
-0.7\ta\t-0.3
-0.9\tb\t-0.2
-1.5\t</s>

\\2-grams:
-0.2\t<s> a
-0.4\ta b

\\end\\
"""

CORPUS = [
    "the cat sat on the mat",
    "the dog sat on the log",
    "a cat and a dog",
    "the cat ate the rat",
    "a rat sat",
    "the mat and the log",
    "dog ate cat",
    "the the cat",
] * 3 + ["on a mat", "a dog sat on a cat", "rat and cat and dog"]


def test_hand_worked_backoff_scores() -> None:
    lm = ArpaLM.from_lines(HAND_ARPA.splitlines())
    assert lm.order == 2
    bos = lm.begin_state()
    assert lm.score(bos, "a")[0] == pytest.approx(-0.2)
    assert lm.score(bos, "b")[0] == pytest.approx(-0.5 - 0.9)  # back off through bow(<s>)
    s, state = lm.score(bos, "a")
    assert lm.score(state, "b")[0] == pytest.approx(-0.4)
    assert lm.eos_score(lm.score(state, "b")[1]) == pytest.approx(-0.2 - 1.5)
    assert lm.sentence_score("a b") == pytest.approx(-0.2 - 0.4 - 1.7)
    assert lm.sentence_score("b a") == pytest.approx(-1.4 - 0.9 - 1.8)
    assert lm.sentence_score("zz") == pytest.approx(-2.5 - 1.5)  # unknown word scores as <unk>
    assert "a" in lm and "zz" not in lm
    assert lm.sentence_score("a", bos=False, eos=False) == pytest.approx(-0.7)


def test_reader_rejects_bad_files(tmp_path) -> None:
    with pytest.raises(ValueError, match="declares"):
        ArpaLM.from_lines(HAND_ARPA.replace("ngram 2=2", "ngram 2=3").splitlines())
    with pytest.raises(ValueError, match="ARPA"):
        ArpaLM.from_lines(["hello world"])
    with pytest.raises(FileNotFoundError):
        ArpaLM.from_file(tmp_path / "missing.arpa")
    with pytest.raises(ValueError, match="backend"):
        load_language_model(__file__, backend="srilm")


def _vocab_and_contexts(lm: ArpaLM) -> tuple[list[str], list[tuple[int, ...]]]:
    words = [w for w in lm.vocab if w != "<s>"]
    contexts = [()] + [k for k in lm._table if len(k) < lm.order]
    return words, contexts


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_kneser_ney_distributions_sum_to_one(order: int) -> None:
    lm = ArpaLM.from_lines(build_arpa(CORPUS, order=order).splitlines())
    words, contexts = _vocab_and_contexts(lm)
    for ctx in contexts:
        if ctx and lm.vocab.get("</s>") in ctx[-1:]:
            continue
        total = sum(10 ** lm._score_id(ctx, lm.vocab[w])[0] for w in words)
        assert total == pytest.approx(1.0, abs=2e-6), ctx


def zipf_corpus(n: int = 400, seed: int = 0) -> list[str]:
    """Sentences of Zipf-distributed words (natural counts-of-counts)."""
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(500)]
    p = 1.0 / np.arange(1, 501)
    p /= p.sum()
    return [" ".join(rng.choice(words, size=int(rng.integers(2, 8)), p=p)) for _ in range(n)]


def test_kneser_ney_bigram_matches_direct_formula() -> None:
    # an independent bigram interpolated modified-KN computed straight from counts
    sentences = zipf_corpus()
    corpus = [s.split() for s in sentences]
    big = Counter()
    for words in corpus:
        seq = ["<s>", *words, "</s>"]
        big.update(zip(seq, seq[1:], strict=False))
    cont = Counter(b for (_, b) in big)  # continuation counts of unigrams
    vocab = sorted({w for s in corpus for w in s} | {"</s>", "<unk>"})

    def discounts(counts: list[int]) -> tuple[float, float, float]:
        t = Counter(c for c in counts if c <= 4)
        y = t[1] / (t[1] + 2 * t[2])
        ds = (1 - 2 * y * t[2] / t[1], 2 - 3 * y * t[3] / t[2], 3 - 4 * y * t[4] / t[3])
        assert all(0 < dk <= k + 1 for k, dk in enumerate(ds))  # a corpus where the formula applies
        return ds

    d_uni = discounts([cont[w] for w in vocab if cont[w] > 0])
    d_big = discounts(list(big.values()))

    def d(ds: tuple[float, float, float], c: int) -> float:
        return 0.0 if c == 0 else ds[min(c, 3) - 1]

    tot_uni = sum(cont[w] for w in vocab)
    n_uni = [sum(1 for w in vocab if min(cont[w], 3) == k) for k in (1, 2, 3)]
    gamma_uni = sum(dk * nk for dk, nk in zip(d_uni, n_uni, strict=False)) / tot_uni

    def p_uni(w: str) -> float:
        return max(cont[w] - d(d_uni, cont[w]), 0) / tot_uni + gamma_uni / len(vocab)

    def p_big(h: str, w: str) -> float:
        row = {b: c for (a, b), c in big.items() if a == h}
        tot = sum(row.values())
        n = [sum(1 for c in row.values() if min(c, 3) == k) for k in (1, 2, 3)]
        gamma = sum(dk * nk for dk, nk in zip(d_big, n, strict=False)) / tot
        c = row.get(w, 0)
        return max(c - d(d_big, c), 0) / tot + gamma * p_uni(w)

    lm = ArpaLM.from_lines(build_arpa(sentences, order=2).splitlines())
    for h in ("<s>", "w0", "w3", "w17"):
        state = (lm.vocab[h],)
        for w in ("w0", "w1", "</s>", "w5", "w40", "<unk>"):
            assert 10 ** lm.score(state, w)[0] == pytest.approx(p_big(h, w), rel=1e-5), (h, w)


def test_builder_validates_input(tmp_path) -> None:
    with pytest.raises(ValueError, match="order"):
        build_arpa(CORPUS, order=0)
    with pytest.raises(ValueError, match="no words"):
        build_arpa(["", "  "], order=2)
    with pytest.raises(TypeError):
        build_arpa("the cat", order=2)
    with pytest.raises(FileNotFoundError):
        write_arpa(tmp_path / "nope.txt", tmp_path / "out.arpa")


def test_written_arpa_round_trips_through_both_readers(tmp_path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    arpa = tmp_path / "lm.arpa"
    n = write_arpa(corpus, arpa, order=3)
    assert n > 0
    ours = ArpaLM.from_file(arpa)
    assert "cat" in load_unigrams_from_arpa(arpa)
    sentences = ["the cat sat", "a dog ate the rat", "zebra cat", "the the the", "", "cat on mat and log"]
    if not kenlm_available():
        pytest.skip("kenlm not installed: the pure-Python reader was checked by the other tests")
    theirs = KenLMModel(arpa)
    assert isinstance(load_language_model(arpa), KenLMModel)
    for s in sentences:
        assert ours.sentence_score(s) == pytest.approx(theirs.sentence_score(s), abs=1e-4), s
        assert ours.sentence_score(s, bos=False, eos=False) == pytest.approx(
            theirs.sentence_score(s, bos=False, eos=False), abs=1e-4
        )
    # the adapters agree word by word, including states after unknown words
    a_state, k_state = ours.begin_state(), theirs.begin_state()
    for w in "the zebra cat sat on the mat".split():
        a, a_state = ours.score(a_state, w)
        k, k_state = theirs.score(k_state, w)
        assert a == pytest.approx(k, abs=1e-4), w
    # score_many is score, pair by pair
    words = "the zebra cat sat on the mat".split()
    k_states = [theirs.begin_state()]
    for w in words[:-1]:
        k_states.append(theirs.score(k_states[-1], w)[1])
    logps, _ = theirs.score_many(k_states, words)
    assert logps == [theirs.score(st, w)[0] for st, w in zip(k_states, words, strict=True)]


def test_fusion_rules() -> None:
    lm = ArpaLM.from_lines(HAND_ARPA.splitlines())
    fusion = LanguageModelFusion(lm, unigrams=["a", "b", "zz"], alpha=0.5, beta=2.0, unk_score_offset=-3.0)
    assert fusion.unigrams == {"a", "b"}  # words unknown to the model are dropped
    s, state = fusion.score_word(fusion.start_state(), "a")
    assert s == pytest.approx(0.5 * -0.2 * math.log(10) + 2.0)
    s, _ = fusion.score_word(state, "zz", is_last=True)
    assert s == pytest.approx(0.5 * (-0.3 - 2.0 - 3.0 - 1.5) * math.log(10) + 2.0)
    assert fusion.score_partial("a") == 0.0
    assert fusion.score_partial("q") == -3.0
    assert fusion.score_partial("qqqqqqqqq") == pytest.approx(-3.0 * 9 / 6)
    assert fusion.score_eos(state) == pytest.approx(0.5 * (-0.3 - 1.5) * math.log(10))
    with pytest.raises(ValueError, match="alpha must be a finite number between -1000 and 1000, got nan"):
        LanguageModelFusion(lm, alpha=float("nan"))
    for name, value in (("alpha", 1e308), ("beta", -1e308), ("alpha", 1000.5)):  # the score sums overflowed
        with pytest.raises(ValueError, match=f"^{name} must be a finite number between -1000 and 1000, got"):
            LanguageModelFusion(lm, **{name: value})
    assert LanguageModelFusion(lm, alpha=1000.0, beta=-1000.0).alpha == 1000.0
    with pytest.raises(TypeError, match="alpha"):
        LanguageModelFusion(lm, alpha="0.5")
    no_unigrams = LanguageModelFusion(lm)
    assert no_unigrams.score_partial("a") == -10.0  # pyctcdecode: every partial word is unknown


class _ScoreOnly:
    """An n-gram model with only ``score`` (no ``score_many``), over an ArpaLM."""

    def __init__(self, lm: ArpaLM) -> None:
        self.lm = lm
        self.order = lm.order

    def score(self, state, word):
        return self.lm.score(state, word)

    def __contains__(self, word: object) -> bool:
        return word in self.lm


@pytest.mark.parametrize("unigrams", [None, ["a", "b", "zz"]])
def test_score_words_equals_score_word_one_by_one(unigrams) -> None:
    lm = ArpaLM.from_lines(HAND_ARPA.splitlines())
    words = ["a", "b", "zz", "a", "", "b"]
    for model in (lm, _ScoreOnly(lm)):
        fusion = LanguageModelFusion(model, unigrams=unigrams, alpha=0.7, beta=1.25, unk_score_offset=-4.0)
        states = [lm.begin_state(), (1,), lm.null_state(), (2,), (1,), lm.begin_state()]
        scores, new_states = fusion.score_words(states, words)
        one_by_one = [fusion.score_word(st, w) for st, w in zip(states, words, strict=True)]
        assert scores == [sc for sc, _ in one_by_one]  # bit for bit
        assert new_states == [st for _, st in one_by_one]


def test_prefix_index_and_hotwords() -> None:
    idx = UnigramPrefixIndex(["cat", "car", "dog"])
    assert idx.has_prefix("ca") and idx.has_prefix("cat") and not idx.has_prefix("cow")
    assert idx.has_prefix("")
    hot = Hotwords(["new york", "newt"], weight=4.0)
    assert hot.score("i love new york and newts") == pytest.approx(8.0)
    assert hot.score_partial("ne") == pytest.approx(4.0 * 2 / 3)  # shortest hotword with "ne": "new"
    assert hot.score_partial("yo") == pytest.approx(4.0 * 2 / 4)
    assert hot.score_partial("x") == 0.0
    with pytest.raises(TypeError):
        Hotwords("new york")


# ---------------------------------------------------------------------------------------------------------------
# files that are not UTF-8 text, or not regular files: an error naming the file, through every reader


def _not_text_files(tmp_path):
    """A UTF-16 copy of HAND_ARPA and a binary file, both named .arpa."""
    utf16 = tmp_path / "utf16.arpa"
    utf16.write_text(HAND_ARPA, encoding="utf-16")
    binary = tmp_path / "binary.arpa"
    binary.write_bytes(bytes(range(256)) * 4)
    return [(utf16, "UTF-16"), (binary, "not UTF-8 text")]


def test_an_lm_file_that_is_not_text_is_named(tmp_path) -> None:
    # each gave "'utf-8' codec can't decode byte 0xff in position 150" without the file's name
    from beamkit.ctc import fusion_of
    from beamkit.ctc.compat import build_ctcdecoder

    backends = ["arpa"] + (["kenlm", "auto"] if kenlm_available() else [])
    for path, why in _not_text_files(tmp_path):
        readers = [lambda p=path: ArpaLM.from_file(p), lambda p=path: load_unigrams_from_arpa(p)]
        readers += [lambda p=path, b=b: load_language_model(p, backend=b) for b in backends]
        readers += [lambda p=path, b=b: fusion_of(p, backend=b) for b in backends]
        if kenlm_available() and why == "UTF-16":  # kenlm failed decoding it; binary: kenlm's OSError names it
            readers.append(lambda p=path: build_ctcdecoder(["", "a"], kenlm_model_path=str(p)))
        for read in readers:
            with pytest.raises(ValueError, match="not UTF-8 text") as info:
                read()
            assert str(path) in str(info.value) and why in str(info.value)


def test_a_corpus_that_is_not_text_is_named(tmp_path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat\na cat\n", encoding="utf-16")
    with pytest.raises(ValueError, match=r"corpus .*corpus\.txt is not UTF-8 text .*UTF-16"):
        write_arpa(corpus, tmp_path / "out.arpa")
    assert not (tmp_path / "out.arpa").exists()


def test_a_byte_order_mark_is_not_part_of_the_first_word(tmp_path) -> None:
    plain, marked = tmp_path / "plain.arpa", tmp_path / "marked.arpa"
    plain.write_text(HAND_ARPA, encoding="utf-8")
    marked.write_text(HAND_ARPA, encoding="utf-8-sig")
    assert load_unigrams_from_arpa(marked) == load_unigrams_from_arpa(plain)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("cat sat\n", encoding="utf-8-sig")
    write_arpa(corpus, tmp_path / "out.arpa", order=1)
    assert "\ufeff" not in (tmp_path / "out.arpa").read_text(encoding="utf-8")


def fifo_at(path):
    """A named pipe at ``path`` and a thread that opens it for writing and closes it at once (so a reader that
    opened it anyway sees an empty file instead of blocking); the returned function releases the thread."""
    import os
    import threading

    os.mkfifo(path)
    writer = threading.Thread(target=lambda: open(path, "wb").close(), daemon=True)
    writer.start()

    def release() -> None:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # lets a still-waiting writer's open return
        writer.join(5)
        os.close(fd)

    return release


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="named pipes are POSIX")
def test_a_named_pipe_is_called_one(tmp_path) -> None:
    # a FIFO was reported as "not found" by some readers, and read (blocking until a writer came) by others
    fifo = tmp_path / "lm.arpa"
    release = fifo_at(fifo)
    readers = (
        lambda: ArpaLM.from_file(fifo),
        lambda: load_language_model(fifo),
        lambda: write_arpa(fifo, tmp_path / "o"),
    )
    try:
        for read in readers:
            with pytest.raises(ValueError, match=r"is a named pipe \(FIFO\), not a regular file: .*lm\.arpa"):
                read()
    finally:
        release()
