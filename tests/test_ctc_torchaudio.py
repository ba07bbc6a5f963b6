"""``beamkit.ctc.compat.torchaudio`` (torchaudio's ``ctc_decoder`` drop-in) in the main environment: brute-force
and hand-worked oracles. Agreement with torchaudio's own decoder is tested in ``tests/peer/test_ctc_torchaudio.py``
(``make peer-torchaudio``)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from beamkit.ctc.compat.torchaudio import (  # noqa: E402
    CTCDecoderLM,
    CTCDecoderLMState,
    EmissionsError,
    ctc_decoder,
    download_pretrained_files,
)
from beamkit.lm import build_arpa  # noqa: E402

TOKENS = ["-", "|", "a", "b"]  # blank, silence, two letters
BLANK, SIL = 0, 1


def log_softmax(x: np.ndarray) -> np.ndarray:
    return (x - np.log(np.exp(x).sum(-1, keepdims=True))).astype(np.float32)


def random_emissions(seed: int, T: int, V: int = len(TOKENS)) -> np.ndarray:
    return log_softmax(np.random.default_rng(seed).normal(size=(T, V)) * 2.0)


def collapse(path: tuple[int, ...]) -> tuple[int, ...]:
    """The token sequence of an alignment as flashlight's lexicon-free search reads it: the start is the silence
    token, a repeat without a blank between is one token, blanks are dropped."""
    out = []
    prev, prev_blank = SIL, False
    for n in path:
        if n != BLANK and (n != prev or prev_blank):
            out.append(n)
        prev, prev_blank = n, n == BLANK
    return tuple(out)


def brute_force(
    emissions: np.ndarray, sil_score: float, log_add: bool
) -> dict[tuple[int, ...], tuple[float, tuple[int, ...]]]:
    """Each token sequence's score over every alignment (the best alignment's, or the log-sum over all) and its
    best alignment."""
    T, V = emissions.shape
    scores: dict[tuple[int, ...], list[tuple[float, tuple[int, ...]]]] = {}
    for path in itertools.product(range(V), repeat=T):
        s = sum(float(emissions[t, n]) + (sil_score if n == SIL else 0.0) for t, n in enumerate(path))
        scores.setdefault(collapse(path), []).append((s, path))
    out = {}
    for seq, items in scores.items():
        best = max(items)
        out[seq] = (float(np.logaddexp.reduce([s for s, _ in items])) if log_add else best[0], best[1])
    return out


def framed_tokens(path: tuple[int, ...]) -> list[int]:
    """torchaudio's tokens of a per-frame path: the start's silence, the frames, the end's silence, runs of one
    token as one, blanks dropped."""
    full = [SIL, *path, SIL]
    return [n for i, n in enumerate(full) if n != BLANK and (i == 0 or n != full[i - 1])]


@pytest.mark.parametrize("log_add", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lexicon_free_without_pruning_is_the_brute_force_ranking(seed, log_add):
    T = 5
    emissions = random_emissions(seed, T)
    sil_score = -0.25
    dec = ctc_decoder(None, TOKENS, nbest=6, beam_size=10_000, beam_threshold=1e9, sil_score=sil_score, log_add=log_add)
    (hyps,) = dec(torch.from_numpy(emissions[None]))
    expected = sorted(brute_force(emissions, sil_score, log_add).values(), key=lambda v: -v[0])[:6]
    got = [(h.tokens.tolist(), h.score) for h in hyps]
    for (score, path), (tokens, got_score) in zip(expected, got, strict=True):
        if not log_add:  # the kept alignment is the best one (log-sum merging keeps the best parent at each merge)
            assert tokens == framed_tokens(path)
        # float64 sums of the same float32 terms: max merging adds them in one order (exact up to the order of
        # T additions); log-sum merges pairwise, so a few float64 ulps of the score's size
        assert got_score == pytest.approx(score, rel=1e-12, abs=1e-12)


def test_lexicon_free_timesteps_are_the_best_alignments_token_starts():
    # frames favour a a - b b: the best alignment; a token's step is its first frame + 1 (step 0 is the start)
    e = np.full((5, 4), math.log(0.1 / 3), dtype=np.float32)
    for t, n in enumerate([2, 2, 0, 3, 3]):
        e[t, n] = math.log(0.9)
    (hyps,) = ctc_decoder(None, TOKENS)(torch.from_numpy(e[None]))
    best = hyps[0]
    assert best.tokens.tolist() == [SIL, 2, 3, SIL]
    assert best.timesteps.tolist() == [0, 1, 4, 6]
    assert best.tokens.dtype == torch.int64 and best.timesteps.dtype == torch.int32
    assert best.words == []
    assert best.score == pytest.approx(float(sum(float(e[t, n]) for t, n in enumerate([2, 2, 0, 3, 3]))), abs=0)


def write_lexicon(tmp_path, lines: list[str]) -> str:
    path = tmp_path / "lexicon.txt"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def peaked(path: list[int], V: int = len(TOKENS), peak: float = 0.9) -> np.ndarray:
    e = np.full((len(path), V), math.log((1 - peak) / (V - 1)), dtype=np.float32)
    e[np.arange(len(path)), path] = math.log(peak)
    return e


def test_lexicon_words_word_score_and_unknown_words(tmp_path):
    lexicon = write_lexicon(tmp_path, ["ab a b |", "ba b a |"])
    # a b | b a | : two lexicon words
    path = [2, 3, 1, 3, 2, 1]
    e = peaked(path)
    (hyps,) = ctc_decoder(lexicon, TOKENS, word_score=0.5)(torch.from_numpy(e[None]))
    assert hyps[0].words == ["ab", "ba"]
    am = sum(float(e[t, n]) for t, n in enumerate(path))
    assert hyps[0].score == pytest.approx(am + 2 * 0.5, abs=1e-12)
    # a - a | spells no word: without unknown words the lexicon forces another reading; with them each "a" (a trie
    # node spelling no word) ends an unknown word, as in flashlight
    e = peaked([2, 0, 2, 1])
    (forced,) = ctc_decoder(lexicon, TOKENS)(torch.from_numpy(e[None]))
    assert "<unk>" not in forced[0].words
    (unk,) = ctc_decoder(lexicon, TOKENS, unk_score=-0.1)(torch.from_numpy(e[None]))
    assert unk[0].words == ["<unk>", "<unk>"]


class TableLM(CTCDecoderLM):
    """A word unigram LM from a table (log scores by word index), -1 at the end of the sentence."""

    def __init__(self, table: dict[int, float]):
        self.table = table
        self.calls = 0

    def start(self, start_with_nothing):
        return CTCDecoderLMState()

    def score(self, state, usr_token_idx):
        self.calls += 1
        return state.child(usr_token_idx), self.table.get(usr_token_idx, -5.0)

    def finish(self, state):
        return state.child(-1), -1.0


def test_a_custom_lm_adds_its_word_scores_and_end_score(tmp_path):
    lexicon = write_lexicon(tmp_path, ["ab a b |", "ba b a |"])
    path = [2, 3, 1, 3, 2, 1]
    e = peaked(path)
    probe = ctc_decoder(lexicon, TOKENS)
    table = {probe.word_dict.get_index("ab"): -0.5, probe.word_dict.get_index("ba"): -1.5}
    lm = TableLM(table)
    dec = ctc_decoder(lexicon, TOKENS, lm=lm, lm_weight=0.5)
    (hyps,) = dec(torch.from_numpy(e[None]))
    assert hyps[0].words == ["ab", "ba"]
    am = sum(float(e[t, n]) for t, n in enumerate(path))
    # the look-ahead terms telescope to the words' scores; each is a float32 difference, so the LM sum is exact
    # to float32 rounding of numbers below 2 (2 ** -23 * 2 each, four of them)
    assert hyps[0].score == pytest.approx(am + 0.5 * (-0.5 - 1.5 - 1.0), abs=4 * 2**-22)
    assert lm.calls > 0
    # a zero custom LM decodes as no LM at all
    zero = TableLM({})
    zero.table = {i: 0.0 for i in range(dec.word_dict.index_size())}
    zero.finish = lambda state: (state, 0.0)  # type: ignore[method-assign]
    batch = torch.from_numpy(np.stack([random_emissions(s, 12) for s in range(3)]))
    with_zero = ctc_decoder(lexicon, TOKENS, lm=zero, nbest=3)(batch)
    assert plain(with_zero) == plain(ctc_decoder(lexicon, TOKENS, nbest=3)(batch))


def plain(results):
    """Hypotheses (one list or a batch of lists) as comparable tuples: tokens, words, score, timesteps."""
    if results and isinstance(results[0], list):
        return [plain(r) for r in results]
    return [(h.tokens.tolist(), h.words, h.score, h.timesteps.tolist()) for h in results]


def test_kenlm_arpa_scores_words_in_log10(tmp_path):
    pytest.importorskip("kenlm")
    lexicon = write_lexicon(tmp_path, ["ab a b |", "ba b a |"])
    arpa = tmp_path / "words.arpa"
    arpa.write_text(build_arpa(["ab ba", "ab ab", "ba"], order=2), encoding="utf-8")
    path = [2, 3, 1, 3, 2, 1]
    e = peaked(path)
    (hyps,) = ctc_decoder(lexicon, TOKENS, lm=str(arpa), lm_weight=1.0)(torch.from_numpy(e[None]))
    import kenlm

    model = kenlm.Model(str(arpa))
    lm_total = model.score("ab ba", bos=True, eos=True)  # log10, as flashlight scores
    am = sum(float(e[t, n]) for t, n in enumerate(path))
    assert hyps[0].words == ["ab", "ba"]
    assert hyps[0].score == pytest.approx(am + lm_total, abs=8 * 2**-20)


def test_incremental_decoding_equals_one_call_and_lengths_equal_slices():
    emissions = torch.from_numpy(np.stack([random_emissions(s, 20) for s in range(2)]))
    dec = ctc_decoder(None, TOKENS, nbest=4, beam_size=8)
    whole = dec(emissions)
    dec.decode_begin()
    for chunk in torch.split(emissions[0], [3, 0, 9, 8]):
        dec.decode_step(chunk.contiguous())
    dec.decode_end()
    assert plain(dec.get_final_hypothesis()) == plain(whole[0])
    cut = dec(emissions, torch.tensor([20, 11]))
    assert plain(cut[0]) == plain(whole[0])
    assert plain(cut[1]) == plain(dec(emissions[1:, :11].contiguous())[0])


def test_bad_input_is_named():
    dec = ctc_decoder(None, TOKENS)
    with pytest.raises(ValueError, match="float32"):
        dec(torch.zeros(1, 3, 4, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="3D"):
        dec(torch.zeros(3, 4))
    with pytest.raises(EmissionsError, match="a column per token"):
        dec(torch.zeros(1, 3, 3))
    with pytest.raises(EmissionsError, match="lengths"):
        dec(torch.zeros(1, 3, 4), torch.tensor([4]))
    with pytest.raises(ValueError, match="blank_token"):
        ctc_decoder(None, TOKENS, blank_token="<pad>")
    with pytest.raises(ValueError, match="beam_size"):
        ctc_decoder(None, TOKENS, beam_size=0)
    with pytest.raises(ValueError, match="lexicon"):
        ctc_decoder("/nonexistent/lexicon.txt", TOKENS)


def test_lexicon_file_errors_name_the_line(tmp_path):
    bad = write_lexicon(tmp_path, ["ab a b |", "lonely"])
    with pytest.raises(ValueError, match="line 2"):
        ctc_decoder(bad, TOKENS)
    unknown = write_lexicon(tmp_path, ["ab a x |"])
    with pytest.raises(ValueError, match="'x'"):
        ctc_decoder(unknown, TOKENS)


def test_download_pretrained_files_is_refused_with_the_address():
    with pytest.raises(RuntimeError, match="does not download.*librispeech-4-gram"):
        download_pretrained_files("librispeech-4-gram")
    with pytest.raises(ValueError, match="not supported"):
        download_pretrained_files("nope")


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"log_add": True, "beam_size_token": 3, "beam_threshold": 6.0},
        {"lexicon": True, "unk_score": -2.0, "sil_score": -0.3, "word_score": 0.4},
        {"lexicon": True, "lm": "table", "log_add": True, "lm_weight": 0.7},
    ],
    ids=["free", "free-log-add-pruned", "lexicon-unk", "lexicon-custom-lm"],
)
def test_the_compiled_and_interpreted_searches_agree(kwargs, tmp_path):
    # the oracle: an interpreted search of its own (tests/lexicon_oracle.py: hypothesis objects and heaps, none of
    # the library loop's arrays and tables)
    from tests.lexicon_oracle import oracle_of

    kwargs = dict(kwargs)
    if kwargs.pop("lexicon", False):
        kwargs["lexicon"] = write_lexicon(tmp_path, ["ab a b |", "ba b a |", "a a |", "bab b a b |"])
    else:
        kwargs["lexicon"] = None

    def build():
        lm = kwargs.get("lm")
        args = {**kwargs, "lm": TableLM({0: -0.5, 1: -1.0, 2: -2.0}) if lm == "table" else None}
        return ctc_decoder(tokens=TOKENS, nbest=5, beam_size=6, **args)

    batch = torch.from_numpy(np.stack([random_emissions(s, 25) for s in range(6)]))
    compiled, interpreted = build(), build()
    interpreted.decoder = oracle_of(interpreted.decoder)
    assert plain(compiled(batch)) == plain(interpreted(batch))
