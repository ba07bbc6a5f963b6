"""Agreement with torchaudio's ``ctc_decoder`` (the peer), in the torchaudio peer environment ``.venv-ta``
(``make peer-torchaudio``): torch, kenlm, and torchaudio's wheel with flashlight-text, torchaudio's decoder loaded
without its compiled extension (``torchaudio_oracle.py``). Skips cleanly elsewhere.

The same emissions, lexicon and LM go to both decoders; each hypothesis must be the same to the bit (tokens,
words, timesteps, score) on >= 99 % of the utterances and the whole n-best list on >= 95 %.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torchaudio_oracle  # noqa: E402

oracle = torchaudio_oracle.load()
if oracle is None:
    pytest.skip(
        "torchaudio's decoder (torch, flashlight-text, torchaudio wheel) is not installed", allow_module_level=True
    )

import torch  # noqa: E402
from tests.bench_script import load_bench  # noqa: E402

from beamkit.ctc.compat import torchaudio as beamkit_ta  # noqa: E402

bench = load_bench("ctc_vs_torchaudio")
UTTERANCES = 30


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return bench.write_assets(tmp_path_factory.mktemp("ta"), np.random.default_rng(2))


@pytest.fixture(scope="module")
def batch():
    texts = bench.sentences(np.random.default_rng(5), UTTERANCES, length=(2, 5))
    rng = np.random.default_rng(6)
    return torch.from_numpy(np.stack([bench.emissions_for(rng, t, 70, 1.5) for t in texts]))


def agreement(ta_results, bk_results) -> tuple[float, float]:
    n = len(ta_results)
    top1 = sum(bench.plain(a[:1]) == bench.plain(b[:1]) for a, b in zip(ta_results, bk_results, strict=True))
    nbest = sum(bench.plain(a) == bench.plain(b) for a, b in zip(ta_results, bk_results, strict=True))
    return top1 / n, nbest / n


@pytest.mark.parametrize(
    "name", ["lexicon-free", "lexicon-free+char-lm", "lexicon", "lexicon+word-lm", "lexicon+unk+log-add"]
)
def test_same_hypotheses_as_torchaudio(name, assets, batch):
    kwargs = {"tokens": bench.TOKENS, "nbest": 8, "beam_size": 30, **bench.settings(assets)[name]}
    ta_results = oracle.ctc_decoder(**kwargs)(batch)
    bk_results = beamkit_ta.ctc_decoder(**kwargs)(batch)
    top1, nbest = agreement(ta_results, bk_results)
    assert top1 >= 0.99 and nbest >= 0.95, (name, top1, nbest)


@pytest.mark.parametrize("lengths", [None, [70, 40, 1, 0]])
def test_lengths_and_incremental_decoding_as_torchaudio(lengths, assets, batch):
    kwargs = {"tokens": bench.TOKENS, "nbest": 5, "beam_size": 20, "lexicon": assets["lexicon.txt"]}
    kwargs["lm"] = assets["words.arpa"]
    ta_dec, bk_dec = oracle.ctc_decoder(**kwargs), beamkit_ta.ctc_decoder(**kwargs)
    part = batch[:4].contiguous()
    lens = None if lengths is None else torch.tensor(lengths)
    assert [bench.plain(h) for h in ta_dec(part, lens)] == [bench.plain(h) for h in bk_dec(part, lens)]
    for dec in (ta_dec, bk_dec):
        dec.decode_begin()
        for chunk in torch.split(batch[0], [10, 25, 35]):
            dec.decode_step(chunk.contiguous())
        dec.decode_end()
    assert bench.plain(ta_dec.get_final_hypothesis()) == bench.plain(bk_dec.get_final_hypothesis())


def custom_lm(base, state_class, words: list[str]):
    """A Python word LM (a made-up unigram by word length, a bigram bonus after 'the') subclassing ``base``,
    with states of ``state_class``; ``words``: the LM dictionary (index -> word)."""

    class LengthLM(base):
        def __init__(self):
            base.__init__(self)
            self.last = {}

        def start(self, start_with_nothing):
            state = state_class()
            self.last[state] = "<s>"
            return state

        def score(self, state, usr_token_idx):
            out = state.child(usr_token_idx)
            word = words[usr_token_idx]
            self.last[out] = word
            bonus = 0.5 if self.last.get(state) == "the" else 0.0
            return out, -0.3 * len(word) + bonus - (5.0 if word == "<unk>" else 0.0)

        def finish(self, state):
            return state.child(-1), -0.7

    return LengthLM()


def test_a_custom_python_lm_as_torchaudio(assets, batch, tmp_path):
    lm_dict = tmp_path / "lm_dict.txt"
    words = [*bench.WORDS, "<unk>"]
    lm_dict.write_text("\n".join(words) + "\n", encoding="utf-8")
    kwargs = {
        "lexicon": assets["lexicon.txt"],
        "tokens": bench.TOKENS,
        "lm_dict": str(lm_dict),
        "nbest": 5,
        "beam_size": 20,
        "lm_weight": 0.8,
        "unk_score": -6.0,
    }
    ta_lm = custom_lm(oracle.CTCDecoderLM, oracle.CTCDecoderLMState, words)
    bk_lm = custom_lm(beamkit_ta.CTCDecoderLM, beamkit_ta.CTCDecoderLMState, words)
    ta_results = oracle.ctc_decoder(lm=ta_lm, **kwargs)(batch[:12].contiguous())
    bk_results = beamkit_ta.ctc_decoder(lm=bk_lm, **kwargs)(batch[:12].contiguous())
    top1, nbest = agreement(ta_results, bk_results)
    assert top1 >= 0.99 and nbest >= 0.95, (top1, nbest)


def test_scores_are_float64_sums_in_flashlights_order(assets, batch):
    # a hypothesis's score is the same double to the bit, not only within float32 rounding
    kwargs = {"tokens": bench.TOKENS, "lexicon": assets["lexicon.txt"], "lm": assets["words.arpa"]}
    ta = oracle.ctc_decoder(**kwargs)(batch[:3].contiguous())
    bk = beamkit_ta.ctc_decoder(**kwargs)(batch[:3].contiguous())
    for a, b in zip(ta, bk, strict=True):
        assert math.isfinite(a[0].score) and a[0].score.hex() == b[0].score.hex()


GUIDE_EXAMPLE = """
import json, sys
import torch
sys.path.insert(0, sys.argv[1])
import torchaudio_oracle
lexicon, calls = sys.argv[2], int(sys.argv[3])
tokens = ["-", "|", "a", "b", "c"]
frames = [4, 2, 0, 3, 1, 2, 3, 1]  # c a - b | a b |
emissions = torch.full((1, len(frames), 5), -4.0)
emissions[0, torch.arange(len(frames)), torch.tensor(frames)] = -0.05
decoder = torchaudio_oracle.load().ctc_decoder if len(sys.argv) < 5 else None
if decoder is None:
    from beamkit.ctc.compat.torchaudio import ctc_decoder as decoder
out = []
for _ in range(calls):
    hyps = decoder(lexicon=lexicon, tokens=tokens, nbest=3, word_score=0.5)(emissions)[0]
    out.append([[h.words, h.tokens.tolist(), h.timesteps.tolist(), h.score] for h in hyps])
print(json.dumps(out))
"""


def _guide_answers(lexicon: Path, calls: int, beamkit: bool = False) -> list[list[tuple]]:
    """The guide example's n-best from ``calls`` calls in a fresh process (torchaudio's, or beamkit's)."""
    import json
    import subprocess

    args = [sys.executable, "-c", GUIDE_EXAMPLE, str(Path(__file__).resolve().parent), str(lexicon), str(calls)]
    done = subprocess.run(args + (["beamkit"] if beamkit else []), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return [[(tuple(w), tuple(t), tuple(s), score) for w, t, s, score in call] for call in json.loads(done.stdout)]


def test_the_guides_example_n_best_is_one_of_torchaudios_answers(tmp_path):
    # The CTC guide's example: its lower-ranked hypotheses each have several alignments of one score (a letter
    # spoken on a blank frame or on its own frame). flashlight keeps whichever of the tied candidates its sort
    # leaves first, which depends on where its LM states lie in memory: the same process gives different
    # timesteps (and sometimes silence tokens) for them from one call to the next, and which of them a process can
    # give at all varies between processes. beamkit keeps one of them, always the same, in every process; each
    # must be one that torchaudio gives (in some process), with torchaudio's score.
    lexicon = tmp_path / "lexicon.txt"
    lexicon.write_text("cab c a b |\nab a b |\n")
    seen: list[set[tuple]] = [set(), set(), set()]
    runs = [_guide_answers(lexicon, 3, beamkit=True) for _ in range(2)]
    ours = runs[0][0]
    assert all(call == ours for run in runs for call in run)  # the same answer on every call, in two processes
    for _ in range(6):  # torchaudio in fresh processes until each of ours is among its answers
        for call in _guide_answers(lexicon, 40):
            for rank, answer in enumerate(call):
                seen[rank].add(answer)
        if all(ours[rank] in seen[rank] for rank in range(3)):
            break
    assert len(ours) == 3 and all(ours[rank] in seen[rank] for rank in range(3)), (ours, seen)
    assert len(seen[0]) == 1  # the best hypothesis has one alignment of its score: torchaudio always agrees


@pytest.mark.parametrize("name", ["lexicon-free", "lexicon", "lexicon+word-lm", "lexicon+unk+log-add"])
def test_the_native_lexicon_decoder_gives_torchaudios_hypotheses(name, assets, batch):
    # beamkit.ctc.LexiconDecoder: numpy in, no torch; the same inputs as torchaudio's ctc_decoder
    from beamkit.ctc import LexiconDecoder, LexiconOptions

    setting = dict(bench.settings(assets)[name])
    kwargs = {"tokens": bench.TOKENS, "nbest": 8, "beam_size": 30, **setting}
    ta_results = oracle.ctc_decoder(**kwargs)(batch)
    lexicon, lm = setting.pop("lexicon"), setting.pop("lm", None)
    setting.pop("lm_dict", None)
    native = LexiconDecoder(bench.TOKENS, lexicon, lm, LexiconOptions(nbest=8, beam_size=30, **setting))
    bk_results = native.decode(batch.numpy())
    top1, nbest = agreement(ta_results, bk_results)
    assert top1 >= 0.99 and nbest >= 0.95, (name, top1, nbest)


@pytest.fixture(scope="module")
def wide_batch(batch):
    # two columns past the tokens: usually far below the frame's best, on about one frame in eight close to it
    rng = np.random.default_rng(11)
    B, T, _ = batch.shape
    best = batch.amax(-1, keepdim=True).numpy()
    extra = np.where(rng.random((B, T, 2)) < 0.125, best - np.abs(rng.normal(size=(B, T, 2))), -8.0)
    return torch.cat([batch, torch.from_numpy(extra.astype(np.float32))], -1).contiguous()


@pytest.mark.parametrize("name", ["lexicon-free", "lexicon", "lexicon+word-lm", "lexicon+unk+log-add"])
def test_emissions_wider_than_the_tokens_as_torchaudio(name, assets, wide_batch):
    # torchaudio decodes over every column: lexicon-free the extra columns are tokens without a name (both
    # decoders' idxs_to_tokens refuse them); with a lexicon they only take part in the frame's beam_size_token best
    kwargs = {"tokens": bench.TOKENS, "nbest": 8, "beam_size": 30, **bench.settings(assets)[name]}
    ta_dec, bk_dec = oracle.ctc_decoder(**kwargs), beamkit_ta.ctc_decoder(**kwargs)
    ta_results, bk_results = ta_dec(wide_batch), bk_dec(wide_batch)
    top1, nbest = agreement(ta_results, bk_results)
    assert top1 >= 0.99 and nbest >= 0.95, (name, top1, nbest)
    n = len(bench.TOKENS)
    emitted = {t for hyps in bk_results for h in hyps for t in h.tokens.tolist() if t >= n}
    if kwargs["lexicon"] is None:
        assert emitted  # the extra columns were emitted: the comparison covers them
        for dec in (ta_dec, bk_dec):
            with pytest.raises(ValueError, match=str(n)):
                dec.idxs_to_tokens(torch.tensor([n]))
    else:
        assert not emitted


def test_emissions_wider_than_the_lms_tokens_are_refused_as_torchaudio(assets, wide_batch):
    # lexicon-free with the tokens as the LM's words: a column past them has no word, torchaudio raises a
    # RuntimeError (beamkit's EmissionsError is one, and a ValueError)
    kwargs = {"tokens": bench.TOKENS, **bench.settings(assets)["lexicon-free+char-lm"]}
    for make in (oracle.ctc_decoder, beamkit_ta.ctc_decoder):
        with pytest.raises(RuntimeError, match="index"):
            make(**kwargs)(wide_batch[:2].contiguous())


@pytest.mark.parametrize(
    "ids", [[2, 2, 0, 3, 3, 3, 0, 3], [], [0, 0, 0], [1, 1, 1], [0, 5, 5, 0, 0, 5, 6, 6], [4, 0, 4, 4, 1, 4, 0]]
)
def test_get_tokens_and_timesteps_as_torchaudio(ids, assets):
    # torchaudio's private helpers (its own tests call them) on the same frame-by-frame ids
    kwargs = {"tokens": bench.TOKENS, "lexicon": assets["lexicon.txt"]}
    ta_dec, bk_dec = oracle.ctc_decoder(**kwargs), beamkit_ta.ctc_decoder(**kwargs)
    for idxs in (torch.tensor(ids, dtype=torch.int64), torch.tensor(ids, dtype=torch.int32)):
        want, got = ta_dec._get_tokens(idxs), bk_dec._get_tokens(idxs)
        assert got.dtype == want.dtype and got.tolist() == want.tolist()
        want, got = ta_dec._get_timesteps(idxs), bk_dec._get_timesteps(idxs)
        assert got.dtype == want.dtype and got.tolist() == want.tolist()
