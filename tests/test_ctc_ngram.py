"""The ARPA model compiled for the CTC searches (``beamkit.ctc.ngram``): its scores against hand-worked back-off
arithmetic, against beamkit's Python ARPA reader (``beamkit.lm.ArpaLM``, an independent implementation), and,
where the ``kenlm`` module is installed, against KenLM itself on every n-gram of the test models (to the bit:
both sum float32 numbers in the same order) with its states merging exactly where KenLM's do; and the cache of
compiled arrays on disk (reused, rebuilt when stale or damaged, kept in the user cache where the model's folder
takes no file)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import pytest

from beamkit.ctc import ngram
from beamkit.lm import ArpaLM, build_arpa

# log10 numbers chosen to be exact in float32 sums only where the test says so
HAND_ARPA = """\\data\\
ngram 1=6
ngram 2=4
ngram 3=2

\\1-grams:
-1.0\t<s>\t-0.5
-2.0\t<unk>
-0.75\ta\t-0.25
-1.25\tb\t-0.125
-1.5\tc
-0.5\t</s>

\\2-grams:
-0.25\t<s> a\t-0.0625
-0.5\ta b\t-0.375
-0.125\tb c
-0.375\tb a

\\3-grams:
-0.0625\t<s> a b
-0.03125\ta b c

\\end\\
"""


def hand(tmp_path: Path) -> ngram.CompiledNGram:
    path = tmp_path / "hand.arpa"
    path.write_text(HAND_ARPA, encoding="utf-8")
    return ngram.compiled_ngram(path)


def walk(c: ngram.CompiledNGram, state: int, words: list[str]) -> tuple[list[float], int]:
    out = []
    for w in words:
        p, state = c.score(state, w)
        out.append(p)
    return out, state


def test_scores_follow_hand_worked_back_off(tmp_path: Path) -> None:
    c = hand(tmp_path)
    # every number below is a sum of dyadic fractions: exact in float32 and float64
    got, _ = walk(c, c.begin_state(), ["a", "b", "c", "</s>"])
    assert got == [-0.25, -0.0625, -0.03125, -0.5]  # p(</s> | a b c): no back-off on the way, p(</s>)
    got, _ = walk(c, c.null_state(), ["c", "a"])
    assert got == [-1.5, -0.75]  # c has no back-off: p(a | c) = p(a)
    got, _ = walk(c, c.begin_state(), ["b"])
    assert got == [-1.25 - 0.5]  # <s> b absent: p(b) + bow(<s>)
    got, _ = walk(c, c.begin_state(), ["a", "a"])
    assert got == [-0.25, -0.75 - 0.25 - 0.0625]  # <s> a a, a a absent: p(a) + bow(a) + bow(<s> a)
    got, _ = walk(c, c.null_state(), ["zebra", "a"])
    assert got == [-2.0, -0.75]  # an unknown word scores as <unk>; its state is the empty context
    assert c.eos_score(c.null_state()) == -0.5
    assert "a" in c and "zebra" not in c and "<unk>" not in c


def test_states_are_the_longest_context_a_longer_ngram_extends(tmp_path: Path) -> None:
    c = hand(tmp_path)
    _, after_c = walk(c, c.begin_state(), ["a", "b", "c"])
    assert after_c == c.null_state()  # "c" and "b c" extend nothing: every history ending in c is one state
    _, after_bc = walk(c, c.null_state(), ["b", "c"])
    assert after_bc == after_c
    _, after_ab = walk(c, c.begin_state(), ["a", "b"])
    assert c.context_words(after_ab) == ["a", "b"]  # "a b c" extends it
    _, after_ba = walk(c, c.null_state(), ["b", "a"])
    assert c.context_words(after_ba) == ["a"]  # "b a" has no back-off and extends nothing: "a" does


def random_models(tmp_path: Path) -> list[Path]:
    rng = np.random.default_rng(3)
    words = "the cat sat on a mat dog ran far away".split()
    corpus = [" ".join(rng.choice(words, size=int(rng.integers(2, 9)))) for _ in range(400)]
    paths = []
    for order in (1, 2, 3, 4, 5):
        path = tmp_path / f"order{order}.arpa"
        path.write_text(build_arpa(corpus, order=order), encoding="utf-8")
        paths.append(path)
    return paths


def test_scores_equal_the_python_arpa_reader_on_random_sentences(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    for path in random_models(tmp_path):
        ref, c = ArpaLM.from_file(path), ngram.compiled_ngram(path)
        vocab = [*ref.words(), "<unk>", "unseen"]
        for trial in range(300):
            start = trial % 2 == 0
            rs, cs = (ref.begin_state(), c.begin_state()) if start else (ref.null_state(), c.null_state())
            for _ in range(10):
                w = str(vocab[int(rng.integers(len(vocab)))])
                rp, rs = ref.score(rs, w)
                cp, cs = c.score(cs, w)
                # the reader sums float64 numbers, the compiled model float32 ones (as KenLM): a few float32 ulps
                assert cp == pytest.approx(rp, rel=4 * 2**-23, abs=1e-6)
            assert c.eos_score(cs) == pytest.approx(ref.eos_score(rs), rel=4 * 2**-23, abs=1e-6)


def every_ngram(path: Path) -> list[list[str]]:
    out, section = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("\\") and line.endswith("-grams:"):
            section = int(line[1:-7])
        elif section and line.strip() and not line.startswith("\\"):
            out.append(line.split()[1 : 1 + section])
    return out


def test_scores_and_states_equal_kenlm_on_every_ngram(tmp_path: Path) -> None:
    kenlm = pytest.importorskip("kenlm")
    rng = np.random.default_rng(5)
    for path in random_models(tmp_path)[1:]:  # kenlm reads no unigram-only model
        model, c = kenlm.Model(str(path)), ngram.compiled_ngram(path)
        pairs: dict[int, object] = {}  # compiled state -> the KenLM state met with it
        sequences = [(False, g) for g in every_ngram(path)]
        sequences += [(True, g) for g in every_ngram(path)]
        vocab = [*ArpaLM.from_file(path).words(), "<unk>", "unseen"]
        # random sequences: unseen n-grams back off, unknown words
        sequences += [(bool(i % 2), [str(w) for w in rng.choice(vocab, size=8)]) for i in range(300)]
        for begin, words in sequences:
            ks = kenlm.State()
            (model.BeginSentenceWrite if begin else model.NullContextWrite)(ks)
            cs = c.begin_state() if begin else c.null_state()
            for w in [*words, "</s>"]:
                out = kenlm.State()
                kp = model.BaseScore(ks, w, out)
                cp, cs = c.score(cs, w)
                assert cp == kp, (path.name, words, w)
                ks = out
                held = pairs.setdefault(cs, ks)  # equal KenLM states <=> equal compiled states
                assert held == ks
                assert sum(1 for k in pairs.values() if k == ks) == 1


# ---------------------------------------------------------------------------------------------------------------
# the cache on disk


def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "lm.arpa"
    path.write_text(build_arpa(["a b c", "b c a", "c a b a"], order=3), encoding="utf-8")
    return path


def fresh(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Forget compiled models held in memory; count compilations."""
    monkeypatch.setattr(ngram, "_loaded", {})
    compiled: list[str] = []
    real = ngram.compile_arpa

    def counting(lm: ArpaLM) -> ngram.CompiledNGram:
        compiled.append("compiled")
        return real(lm)

    monkeypatch.setattr(ngram, "compile_arpa", counting)
    return compiled


def scores(c: ngram.CompiledNGram) -> list[float]:
    return walk(c, c.begin_state(), ["a", "b", "c", "a", "</s>"])[0]


def test_the_cache_is_written_next_to_the_file_and_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = model_file(tmp_path)
    compiled = fresh(monkeypatch)
    first = scores(ngram.compiled_ngram(path))
    assert compiled == ["compiled"] and os.path.isfile(str(path) + ngram.CACHE_SUFFIX)
    monkeypatch.setattr(ngram, "_loaded", {})
    assert scores(ngram.compiled_ngram(path)) == first and compiled == ["compiled"]  # read, not compiled


def test_a_stale_cache_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = model_file(tmp_path)
    compiled = fresh(monkeypatch)
    ngram.compiled_ngram(path)
    path.write_text(build_arpa(["a a a b", "c c"], order=3), encoding="utf-8")  # another model, same name
    monkeypatch.setattr(ngram, "_loaded", {})
    got = scores(ngram.compiled_ngram(path))
    assert compiled == ["compiled", "compiled"]
    ref = ArpaLM.from_file(path)
    state, want = ref.begin_state(), []
    for w in ["a", "b", "c", "a", "</s>"]:
        p, state = ref.score(state, w)
        want.append(p)
    assert got == pytest.approx(want, rel=4 * 2**-23)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "out_of_range", "other_file", "old_format"])
def test_a_damaged_cache_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str) -> None:
    path = model_file(tmp_path)
    compiled = fresh(monkeypatch)
    want = scores(ngram.compiled_ngram(path))
    cache = Path(str(path) + ngram.CACHE_SUFFIX)
    if damage == "garbage":
        cache.write_bytes(b"not an npz file at all")
    elif damage == "truncated":
        cache.write_bytes(cache.read_bytes()[:300])
    else:
        with np.load(cache) as z:
            parts = {k: z[k] for k in z.files}
        if damage == "out_of_range":
            parts["state"] = parts["state"] + 10**6  # numbers that parse but index past the arrays
        elif damage == "other_file":
            parts["path"] = np.array("/elsewhere/lm.arpa")
        else:
            parts["meta"] = parts["meta"].copy()
            parts["meta"][0] = ngram.CACHE_FORMAT + 1
        with open(cache, "wb") as fh:
            np.savez(fh, **parts)
    monkeypatch.setattr(ngram, "_loaded", {})
    assert scores(ngram.compiled_ngram(path)) == want
    assert compiled == ["compiled", "compiled"]
    monkeypatch.setattr(ngram, "_loaded", {})
    ngram.compiled_ngram(path)
    assert compiled == ["compiled", "compiled"]  # the rebuilt cache is good


def test_the_user_cache_holds_it_where_the_folder_takes_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = model_file(tmp_path)
    Path(str(path) + ngram.CACHE_SUFFIX).mkdir()  # nothing can be written there
    user = tmp_path / "user-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(user))
    compiled = fresh(monkeypatch)
    want = scores(ngram.compiled_ngram(path))
    assert [p.name for p in (user / "beamkit").iterdir()] == [Path(ngram.cache_paths(str(path))[1]).name]
    monkeypatch.setattr(ngram, "_loaded", {})
    assert scores(ngram.compiled_ngram(path)) == want and compiled == ["compiled"]


def test_only_arpa_text_is_compiled(tmp_path: Path) -> None:
    path = model_file(tmp_path)
    assert ngram.ngram_of(str(path)) is not None
    assert ngram.ngram_of(ArpaLM.from_file(path)) is not None
    binary = tmp_path / "lm.bin"
    binary.write_bytes(b"mmap lm http://kheafield.com/code format version 5\n\0\0\0")
    assert ngram.ngram_of(str(binary)) is None
    assert ngram.ngram_of(object()) is None


def test_a_malformed_arpa_file_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.arpa"
    bad.write_text("\\data\\\nngram 1=1\n\n\\1-grams:\nnot-a-number a\n\\end\\\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.arpa, line 5"):
        ngram.compiled_ngram(bad)


def test_every_sequence_of_the_hand_model_matches_the_reader(tmp_path: Path) -> None:
    c = hand(tmp_path)
    ref = ArpaLM.from_lines(HAND_ARPA.splitlines())
    for words in itertools.product(["a", "b", "c", "x", "</s>"], repeat=3):
        rp, _ = walk_ref(ref, list(words))
        cp, _ = walk(c, c.begin_state(), list(words))
        assert cp == pytest.approx(rp, rel=4 * 2**-23)


def walk_ref(ref: ArpaLM, words: list[str]) -> tuple[list[float], object]:
    state, out = ref.begin_state(), []
    for w in words:
        p, state = ref.score(state, w)
        out.append(p)
    return out, state
