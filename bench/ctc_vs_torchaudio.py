"""Benchmark: beamkit's torchaudio drop-in (``beamkit.ctc.compat.torchaudio.ctc_decoder``) against torchaudio's own
``ctc_decoder`` on the same emissions, lexicon and LM: speed per utterance and batched, word error rate, agreement.

Runs in the torchaudio peer environment (``make peer-torchaudio`` builds ``.venv-ta``: torch, kenlm, and
torchaudio's wheel with flashlight-text; torchaudio's decoder is loaded without its compiled extension, see
``tests/peer/torchaudio_oracle.py``):

    .venv-ta/bin/python bench/ctc_vs_torchaudio.py                 # a few minutes
    .venv-ta/bin/python bench/ctc_vs_torchaudio.py --utterances 10 --quick

Data: sentences of a fixed 60-word vocabulary drawn from a seeded bigram chain; synthetic peaky emissions over
29 tokens (blank ``-``, silence ``|``, a-z, apostrophe), each character 1-3 frames, a blank before a character
half the time, Gaussian noise on every frame's logits (``--noise``); T = ``--frames``. The LMs are Kneser-Ney
ARPA files built from a sampled corpus with beamkit (a word 3-gram, a character 5-gram), read by KenLM on both
sides. Settings: lexicon-free without and with the character LM, lexicon without and with the word LM, and a
lexicon with unknown words, log-add merging and a token beam.

Per setting it prints ``ctc-ta-speedup[SETTING]: 2.3x`` (torchaudio's time / beamkit's, the figure a user sees: fresh
decoders with cold LM caches, one ``decoder(emissions)`` call per utterance, each utterance decoded once, the two
decoders alternating; the median of ``--repeats`` such runs), the batched ratio (all utterances in one call), the
word error rate of each, and the agreement: top-1 identical (tokens, words, timesteps and score, to the bit) and
n-best identical.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

TOKENS = ["-", "|", *"abcdefghijklmnopqrstuvwxyz'"]
WORDS = (
    "the of and to in is was he for it with as his on be at by had are but from or have an they which one you were "
    "her all she there would their we him been has when who will more no if out so said what up its about into than "
    "them can only other new some could time these two may then do first any my now such like our over man me even "
    "most made after also did many before must through back years where much your way well down should because each "
    "just those people mr how too little state good very make world still own see men work long get here between "
    "both life being under never day same another know while last might us great old year off come since against go "
    "came right used take three don't can't it's"
).split()


def sentences(rng: np.random.Generator, n: int, length: tuple[int, int] = (3, 8)) -> list[str]:
    """``n`` sentences from a seeded bigram chain over WORDS (each word has 8 likely successors)."""
    succ = rng.integers(0, len(WORDS), size=(len(WORDS), 8))
    out = []
    for _ in range(n):
        w = int(rng.integers(len(WORDS)))
        words = [WORDS[w]]
        for _ in range(int(rng.integers(length[0], length[1] + 1)) - 1):
            w = int(succ[w, rng.integers(8)]) if rng.random() < 0.8 else int(rng.integers(len(WORDS)))
            words.append(WORDS[w])
        out.append(" ".join(words))
    return out


def emissions_for(rng: np.random.Generator, text: str, frames: int, noise: float) -> np.ndarray:
    """float32 log-probabilities of shape (frames, len(TOKENS)) peaked on an alignment of ``text``."""
    path: list[int] = []
    for ch in text:
        i = 1 if ch == " " else TOKENS.index(ch)
        if (path and path[-1] == i) or rng.random() < 0.5:
            path.append(0)
        path += [i] * int(rng.integers(1, 4))
    path = (path + [0] * frames)[:frames]
    logits = rng.normal(size=(frames, len(TOKENS))) * noise
    logits[np.arange(frames), path] += 5.0
    logits -= np.log(np.exp(logits).sum(-1, keepdims=True))
    return logits.astype(np.float32)


def write_assets(folder: Path, rng: np.random.Generator) -> dict[str, str]:
    """The tokens file, lexicon (each word spelled by its letters then ``|``), word 3-gram and character 5-gram
    ARPA files, and the tokens as an LM dictionary; their paths by name."""
    from beamkit.lm import build_arpa

    corpus = sentences(rng, 3000)
    paths = {name: str(folder / name) for name in ("tokens.txt", "lexicon.txt", "words.arpa", "chars.arpa")}
    Path(paths["tokens.txt"]).write_text("\n".join(TOKENS) + "\n", encoding="utf-8")
    Path(paths["lexicon.txt"]).write_text("".join(f"{w} {' '.join(w)} |\n" for w in WORDS), encoding="utf-8")
    Path(paths["words.arpa"]).write_text(build_arpa(corpus, order=3), encoding="utf-8")
    chars = [" ".join(s.replace(" ", "|")) for s in corpus[:1500]]
    Path(paths["chars.arpa"]).write_text(build_arpa(chars, order=5), encoding="utf-8")
    return paths


def settings(paths: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The decoder arguments of each setting (shared by both decoders)."""
    lex, words, chars, toks = paths["lexicon.txt"], paths["words.arpa"], paths["chars.arpa"], paths["tokens.txt"]
    return {
        "lexicon-free": {"lexicon": None},
        "lexicon-free+char-lm": {"lexicon": None, "lm": chars, "lm_dict": toks, "lm_weight": 0.5},
        "lexicon": {"lexicon": lex},
        "lexicon+word-lm": {"lexicon": lex, "lm": words, "lm_weight": 1.0, "word_score": 0.5},
        "lexicon+unk+log-add": {
            "lexicon": lex,
            "lm": words,
            "lm_weight": 1.0,
            "unk_score": -4.0,
            "sil_score": -0.2,
            "log_add": True,
            "beam_size_token": 10,
            "beam_threshold": 25.0,
        },
    }


def plain(hyps: list[Any]) -> list[tuple[list[int], list[str], float, list[int]]]:
    """Hypotheses as comparable tuples (tokens, words, score, timesteps)."""
    return [(h.tokens.tolist(), list(h.words), float(h.score), h.timesteps.tolist()) for h in hyps]


def transcript(decoder: Any, hyp: Any) -> list[str]:
    """The words of a hypothesis (lexicon-free: its tokens split at the silence token)."""
    if hyp.words:
        return list(hyp.words)
    text = "".join(decoder.idxs_to_tokens(hyp.tokens)).replace("|", " ")
    return text.split()


def word_errors(ref: list[str], hyp: list[str]) -> int:
    """Levenshtein distance between two word lists."""
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1]


def timed(fn: Any, repeats: int) -> tuple[float, Any]:
    """The best wall time of ``repeats`` runs of ``fn()`` (after a full garbage collection each) and its result."""
    best, result = float("inf"), None
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def per_utterance(make_ta: Any, make_bk: Any, tensors: list[Any]) -> tuple[float, float, list[Any], list[Any]]:
    """The figure a user sees: fresh decoders (LM caches cold), one call per utterance, each utterance decoded
    once, the two decoders alternating utterance by utterance (which goes first alternates too). Returns both
    total times and results."""
    ta_dec, bk_dec = make_ta(), make_bk()
    t_ta = t_bk = 0.0
    ta_out, bk_out = [], []
    gc.collect()
    for i, x in enumerate(tensors):
        for side in (0, 1) if i % 2 == 0 else (1, 0):
            start = time.perf_counter()
            if side == 0:
                ta_out.append(ta_dec(x)[0])
                t_ta += time.perf_counter() - start
            else:
                bk_out.append(bk_dec(x)[0])
                t_bk += time.perf_counter() - start
    return t_ta, t_bk, ta_out, bk_out


def compare(name: str, make_ta: Any, make_bk: Any, batch: np.ndarray, texts: list[str], repeats: int) -> str:
    """One setting's line: speed per utterance (the median of ``repeats`` cold runs) and batched, word error
    rates, agreement."""
    import torch

    tensors = [torch.from_numpy(batch[i : i + 1]) for i in range(len(texts))]
    whole = torch.from_numpy(batch)
    make_bk().__call__(tensors[0])  # the compiled search loaded into the process, on a decoder thrown away
    runs = [per_utterance(make_ta, make_bk, tensors) for _ in range(repeats)]
    ratios = sorted(r[0] / r[1] for r in runs)
    t_ta, t_bk, ta_out, bk_out = runs[0]
    ta_dec, bk_dec = make_ta(), make_bk()
    tb_ta, _ = timed(lambda: ta_dec(whole), repeats)
    tb_bk, bk_batched = timed(lambda: bk_dec(whole), repeats)
    top1 = sum(plain(a[:1]) == plain(b[:1]) for a, b in zip(ta_out, bk_out, strict=True))
    nbest = sum(plain(a) == plain(b) for a, b in zip(ta_out, bk_out, strict=True))
    batched_same = sum(plain(a) == plain(b) for a, b in zip(bk_out, bk_batched, strict=True))
    refs = [t.split() for t in texts]
    n_ref = sum(len(r) for r in refs)
    wer_ta = sum(word_errors(r, transcript(ta_dec, h[0])) for r, h in zip(refs, ta_out, strict=True)) / n_ref
    wer_bk = sum(word_errors(r, transcript(bk_dec, h[0])) for r, h in zip(refs, bk_out, strict=True)) / n_ref
    n = len(texts)
    runs_text = ", ".join(f"{r:.2f}" for r in ratios)
    return (
        f"ctc-ta-speedup[{name}]: {ratios[len(ratios) // 2]:.2f}x per utterance, cold, interleaved "
        f"(torchaudio {1e3 * t_ta / n:.1f} ms, beamkit {1e3 * t_bk / n:.1f} ms; runs {runs_text}), "
        f"batched {tb_ta / tb_bk:.2f}x; WER torchaudio {100 * wer_ta:.1f}% beamkit {100 * wer_bk:.1f}%; "
        f"agreement top-1 {100 * top1 / n:.1f}%, n-best {100 * nbest / n:.1f}% "
        f"(batched = per utterance: {batched_same}/{n})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--utterances", type=int, default=40)
    parser.add_argument("--frames", type=int, default=150)
    parser.add_argument("--beam", type=int, default=50)
    parser.add_argument("--nbest", type=int, default=10)
    parser.add_argument("--noise", type=float, default=1.5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one repeat, the first two settings only")
    parser.add_argument("--only", default=None, help="run one setting (by name)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "peer"))
    import torch
    import torchaudio_oracle

    from beamkit.ctc.compat import torchaudio as beamkit_ta

    oracle = torchaudio_oracle.load()
    if oracle is None:
        print("torchaudio's decoder is not loadable here (needs torch, flashlight-text and the torchaudio wheel)")
        return 1
    repeats = 1 if args.quick else args.repeats
    rng = np.random.default_rng(0)
    texts = sentences(np.random.default_rng(1), args.utterances)
    batch = np.stack([emissions_for(rng, t, args.frames, args.noise) for t in texts])
    print(
        f"{args.utterances} utterances, T={args.frames}, V={len(TOKENS)}, beam {args.beam}, nbest {args.nbest}, "
        f"torch {torch.__version__}, {os.cpu_count()} cores"
    )
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_assets(Path(tmp), np.random.default_rng(2))
        chosen = settings(paths)
        if args.only:
            chosen = {args.only: chosen[args.only]}
        elif args.quick:
            chosen = dict(list(chosen.items())[:2])
        for name, kwargs in chosen.items():
            common = {"tokens": TOKENS, "nbest": args.nbest, "beam_size": args.beam, **kwargs}
            print(
                compare(
                    name,
                    lambda common=common: oracle.ctc_decoder(**common),
                    lambda common=common: beamkit_ta.ctc_decoder(**common),
                    batch,
                    texts,
                    repeats,
                )
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
