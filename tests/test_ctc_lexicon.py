"""``beamkit.ctc.LexiconDecoder`` (numpy in, no torch) and ``beamkit ctc decode --lexicon``: the guide's hand-worked
example, an independent interpreted search (``tests/lexicon_oracle.py``) as the oracle on random emissions, the
same search run without numba, and the options and input checks. Agreement with torchaudio's own decoder:
``tests/peer/test_ctc_torchaudio.py``."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from beamkit.cli import entry as cli
from beamkit.ctc import LexiconDecoder, LexiconOptions
from tests.lexicon_oracle import oracle_of

TOKENS = ["-", "|", "a", "b", "c"]
SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture
def lexicon(tmp_path: Path) -> str:
    path = tmp_path / "lexicon.txt"
    path.write_text("cab c a b |\nab a b |\nba b a |\nc c |\n")
    return str(path)


def guide_emissions() -> np.ndarray:
    frames = [4, 2, 0, 3, 1, 2, 3, 1]  # c a - b | a b |
    em = np.full((len(frames), len(TOKENS)), -4.0, dtype=np.float32)
    em[np.arange(len(frames)), frames] = -0.05
    return em


def random_emissions(seed: int, T: int = 20) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(T, len(TOKENS))) * 2.0
    return (x - np.log(np.exp(x).sum(-1, keepdims=True))).astype(np.float32)


def plain(hyps) -> list[tuple]:
    return [(h.tokens.tolist(), list(h.words), float(h.score), h.timesteps.tolist()) for h in hyps]


def oracle_hyps(decoder: LexiconDecoder, em: np.ndarray) -> list[tuple]:
    """The interpreted oracle on the decoder's own trie, LM and options, read out as torchaudio reads a path."""
    search = oracle_of(decoder.search)
    search.begin()
    search.step(em)
    search.end()
    out = []
    for r in search.results()[: decoder.options.nbest]:
        tokens = [t for i, t in enumerate(r.tokens) if t != decoder.blank and (i == 0 or t != r.tokens[i - 1])]
        steps = [i for i, t in enumerate(r.tokens) if t != decoder.blank and (i == 0 or t != r.tokens[i - 1])]
        words = [decoder.word_dict.get_entry(w) for w in r.words if w >= 0] if decoder.word_dict else []
        out.append((tokens, words, float(r.score), steps))
    return out


def test_the_guides_example(lexicon: str) -> None:
    # hand-worked in the CTC guide (and torchaudio's answer): c a - b | a b | spells "cab ab"
    dec = LexiconDecoder(TOKENS, lexicon, options=LexiconOptions(nbest=3, word_score=0.5))
    [hyps] = dec.decode(guide_emissions())
    best = hyps[0]
    assert best.words == ["cab", "ab"]
    assert dec.idxs_to_tokens(best.tokens) == ["|", "c", "a", "b", "|", "a", "b", "|"]
    assert best.timesteps.tolist() == [0, 1, 2, 4, 5, 6, 7, 8]
    assert best.tokens.dtype == np.int64 and best.timesteps.dtype == np.int32
    # the score by hand: the path takes each frame's -0.05 (float32, summed in float64), plus two words at 0.5
    assert best.score == 8 * float(np.float32(-0.05)) + 2 * 0.5


@pytest.mark.parametrize(
    "setting",
    [
        {"lexicon": False},
        {"lexicon": True},
        {"lexicon": True, "unk_score": -2.0, "sil_score": -0.3, "word_score": 0.4, "log_add": True},
        {"lexicon": False, "beam_size_token": 3, "beam_threshold": 6.0},
    ],
    ids=["free", "lexicon", "lexicon-unk-log-add", "free-pruned"],
)
def test_same_hypotheses_as_the_interpreted_oracle(setting: dict, lexicon: str) -> None:
    setting = dict(setting)
    lex = lexicon if setting.pop("lexicon") else None
    dec = LexiconDecoder(TOKENS, lex, options=LexiconOptions(nbest=5, beam_size=6, **setting))
    for seed in range(5):
        em = random_emissions(seed)
        [hyps] = dec.decode(em)
        assert plain(hyps) == oracle_hyps(dec, em), seed


def test_without_numba_the_same_search_runs_as_python(lexicon: str) -> None:
    # BEAMKIT_NO_JIT runs the library's frame loop interpreted (as the numpy-only install does): same hypotheses
    # as the oracle, and no numpy overflow warning from the tables' hashes
    code = (
        "import warnings, numpy as np, sys\n"
        "sys.path.insert(0, '.')\n"
        "warnings.simplefilter('error')\n"
        "from beamkit.ctc import LexiconDecoder, LexiconOptions, jit\n"
        "from tests.test_ctc_lexicon import TOKENS, plain, oracle_hyps, random_emissions\n"
        "assert not jit.COMPILED\n"
        "jit._warned = True  # the one 'runs as plain Python' warning is the expected one\n"
        f"dec = LexiconDecoder(TOKENS, {lexicon!r}, options=LexiconOptions(nbest=4, beam_size=5, unk_score=-3.0))\n"
        "for seed in range(3):\n"
        "    em = random_emissions(seed, 12)\n"
        "    assert plain(dec.decode(em)[0]) == oracle_hyps(dec, em)\n"
        "print('same')\n"
    )
    env = {**os.environ, "PYTHONPATH": SRC, "BEAMKIT_NO_JIT": "1"}
    root = str(Path(__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "same"


@pytest.mark.parametrize("with_lexicon", [False, True], ids=["free", "lexicon"])
def test_a_decoder_makes_its_arrays_once(with_lexicon: bool, lexicon: str) -> None:
    # the search's arrays (beam, back-pointers, state table, a frame's scratch rows) are made by the decoder and
    # its first call, and every later call works in them; each call still gives what a fresh decoder gives and
    # what the interpreted oracle gives
    lex = lexicon if with_lexicon else None
    opts = LexiconOptions(nbest=5, beam_size=6, unk_score=-2.0 if with_lexicon else -math.inf)
    dec = LexiconDecoder(TOKENS, lex, options=opts)
    dec.decode(random_emissions(9, 100))  # longer than the back-pointers first made: they grow once
    run = dec.search._run

    def arrays() -> list[int]:
        return [id(a) for part in (run.beam, run.work, run.table) for a in part]

    made = arrays()
    for seed, frames in ((0, 100), (1, 8), (2, 30), (3, 1)):
        em = random_emissions(seed, frames)
        got = plain(dec.decode(em)[0])
        assert arrays() == made
        assert got == plain(LexiconDecoder(TOKENS, lex, options=opts).decode(em)[0])
        assert got == oracle_hyps(dec, em)


def test_without_an_lm_a_frame_makes_states_only_for_the_hypotheses_it_keeps() -> None:
    # each candidate's new state went into the state table (beam x tokens a frame, 200,000 an utterance on the
    # benchmark, a table far past the CPU caches); only the states the beam keeps need an entry
    beam, frames = 6, 40
    dec = LexiconDecoder(TOKENS, options=LexiconOptions(beam_size=beam, nbest=3))
    em = random_emissions(4, frames)
    [hyps] = dec.decode(em)
    assert int(dec.search._run.table.meta[0]) <= beam * frames  # one a candidate would be up to 6 * 4 * 40
    assert plain(hyps) == oracle_hyps(dec, em)


def test_the_frames_best_tokens_are_chosen_as_a_stable_sort_chooses_them(lexicon: str) -> None:
    # beam_size_token keeps a frame's best tokens; among equal scores the lower token id first (the oracle sorts
    # with a stable sort): frames of tied scores choose by id
    em = np.log(np.full((10, len(TOKENS)), 0.2, dtype=np.float32))
    em[::3, 2] = np.log(np.float32(0.4))  # every third frame "a" leads, the others tie
    em[1::3, [3, 4]] = np.log(np.float32(0.3))  # "b" and "c" tie above the rest
    for lex in (None, lexicon):
        dec = LexiconDecoder(TOKENS, lex, options=LexiconOptions(beam_size=5, nbest=4, beam_size_token=2))
        assert plain(dec.decode(em)[0]) == oracle_hyps(dec, em)


def test_a_later_process_loads_the_compiled_search_from_the_cache(lexicon: str) -> None:
    # numba's cache on disk: the first process that decodes compiles the frame loop and saves it, a later one
    # loads it (no compilation, no note that it compiles)
    from beamkit.ctc import jit
    from beamkit.ctc.lexicon import kernel

    if not jit.COMPILED or type(kernel.run_lexicon_frames._cache).__name__ == "NullCache":
        pytest.skip("nothing is compiled, or numba has no writable cache here")
    code = (
        "import numpy as np\n"
        "from beamkit.ctc import LexiconDecoder\n"
        "from beamkit.ctc.lexicon import kernel\n"
        f"dec = LexiconDecoder({TOKENS!r}, {lexicon!r})\n"
        "dec.decode(np.log(np.full((6, 5), 0.2, dtype=np.float32)))\n"
        "stats = kernel.run_lexicon_frames.stats\n"
        "print(sum(stats.cache_hits.values()), sum(stats.cache_misses.values()))\n"
    )
    env = {**os.environ, "PYTHONPATH": SRC}
    env.pop("BEAMKIT_COMPILE_NOTE", None)
    runs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
        for _ in range(2)
    ]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    assert runs[1].stdout.split() == ["1", "0"]  # loaded from the cache, nothing compiled
    assert jit.COLD_NOTE not in runs[1].stderr


def test_options_are_frozen_and_checked() -> None:
    opts = LexiconOptions(nbest=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.nbest = 3  # type: ignore[misc]
    for field, value, error in [
        ("beam_size", 0, ValueError),
        ("beam_size", 10**9, ValueError),
        ("nbest", 0, ValueError),
        ("lm_weight", float("nan"), ValueError),
        ("log_add", 1, TypeError),
        ("unk_score", float("inf"), ValueError),
    ]:
        with pytest.raises(error, match=field):
            LexiconOptions(**{field: value})
    with pytest.raises(TypeError, match="LexiconOptions"):
        LexiconDecoder(TOKENS, options={"nbest": 2})  # type: ignore[arg-type]


def test_emissions_wider_than_the_tokens_are_decoded_over_every_column(lexicon: str) -> None:
    # as torchaudio: a column past the tokens is a token without a name; the interpreted oracle decodes the same
    rng = np.random.default_rng(7)
    narrow = random_emissions(3, 24)
    extra = np.where(rng.random((24, 2)) < 0.3, narrow.max(-1, keepdims=True) + 0.5, -9.0).astype(np.float32)
    wide = np.ascontiguousarray(np.concatenate([narrow, extra], -1))
    n = len(TOKENS)
    for lex in (lexicon, None):
        for k in (0, 4):  # every column, or the frame's 4 best (the extra columns crowd out tokens)
            dec = LexiconDecoder(TOKENS, lex, options=LexiconOptions(nbest=4, beam_size=8, beam_size_token=k))
            [hyps] = dec.decode(wide)
            assert plain(hyps) == oracle_hyps(dec, wide), (lex, k)
            emitted = {t for h in hyps for t in h.tokens.tolist() if t >= n}
            assert bool(emitted) == (lex is None), (lex, k)  # a lexicon spells its words in the named tokens
    with pytest.raises(ValueError, match=f"unknown index in the dictionary: {n}"):
        dec.idxs_to_tokens([n])
    # every column: with a lexicon the extra ones change nothing
    dec = LexiconDecoder(TOKENS, lexicon, options=LexiconOptions(nbest=4, beam_size=8))
    assert plain(dec.decode(wide)[0]) == plain(dec.decode(narrow)[0])


def test_bad_emissions_are_named(lexicon: str) -> None:
    dec = LexiconDecoder(TOKENS, lexicon)
    with pytest.raises(ValueError, match=r"a column per token \(5\), got 4 columns"):
        dec.decode(np.zeros((3, 4), dtype=np.float32))
    nan = random_emissions(0)
    nan[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        dec.decode(nan)
    with pytest.raises(TypeError):
        dec.decode(np.zeros((3, 5), dtype=bool))
    with pytest.raises(ValueError, match="lengths"):
        dec.decode(np.zeros((2, 3, 5), dtype=np.float32), [3])
    with pytest.raises(RuntimeError, match="decode_step before decode_begin"):
        LexiconDecoder(TOKENS, lexicon).step(random_emissions(1))
    # incremental decoding gives what one call gives
    em = random_emissions(2, 16)
    dec.begin()
    for chunk in np.split(em, [5, 5, 11]):
        dec.step(chunk)
    dec.end()
    assert plain(dec.hypotheses()) == plain(dec.decode(em)[0])


def test_the_command_decodes_with_a_lexicon(lexicon: str, tmp_path: Path, capsys) -> None:
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(TOKENS) + "\n")
    em = np.stack([guide_emissions(), random_emissions(3, 8)])
    np.save(tmp_path / "em.npy", em)
    argv = ["ctc", "decode", str(tmp_path / "em.npy"), "--labels", str(labels), "--blank", "0", "--lexicon", lexicon]
    assert cli.main([*argv, "--input-kind", "log_probs", "--json", "--top", "2"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    # the command decodes the log-softmax of each matrix (as every CTC command reads its input), as float32
    lp = em - np.log(np.exp(em.astype(np.float64)).sum(-1, keepdims=True))
    dec = LexiconDecoder(TOKENS, lexicon, options=LexiconOptions(beam_size=100, nbest=2))
    for row, hyps in zip(rows, dec.decode(lp.astype(np.float32)), strict=True):
        assert [b["words"] for b in row["beams"]] == [h.words for h in hyps]
        assert [b["timesteps"] for b in row["beams"]] == [h.timesteps.tolist() for h in hyps]
        assert [b["score"] for b in row["beams"]] == pytest.approx([h.score for h in hyps], abs=1e-5)
    assert cli.main([*argv, "--input-kind", "log_probs"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "cab ab"
    assert cli.main([*argv, "--greedy"]) == 2
    assert "--greedy does not apply to --lexicon" in capsys.readouterr().err
