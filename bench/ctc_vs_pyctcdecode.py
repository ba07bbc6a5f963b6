"""Benchmark: beamkit CTC prefix beam search vs pyctcdecode, without and with a word 3-gram LM.

Runs in the peer environment (pyctcdecode pins numpy<2), see tests/peer/README or the CTC report:

    .venv-peer/bin/python bench/ctc_vs_pyctcdecode.py            # ~2 minutes
    .venv-peer/bin/python bench/ctc_vs_pyctcdecode.py --utterances 50 --quick

Data: sentences sampled from a bigram chain over the word counts shipped in the ``wordsegment`` package
(top words only); a 3-gram Kneser-Ney ARPA is built from a sampled corpus with ``beamkit lm build``.
Posteriors are synthetic but peaky: T=200 frames, V=30 labels (blank, space, a-z, apostrophe, hyphen),
each character 1-3 frames, the true label carrying most of the mass, a confusable letter now and then,
Dirichlet noise elsewhere. Both decoders get the same log-probabilities, beam_width 100 and their default
pruning; the ARPA is read by kenlm on both sides when kenlm is installed (``--beamkit-lm arpa`` makes
beamkit use its pure-Python reader).

Prints, per setting, ``ctc-speedup-per-utterance[no-lm]: 5.3x``, the figure a user sees: fresh decoders (beamkit's
LM cache empty), one call per utterance, each utterance decoded once, the two alternating utterance by utterance,
the median of ``--repeats`` runs; then ``ctc-speedup[no-lm]: 12.3x, agreement 99.6%`` where the speedup compares
pyctcdecode's ``decode`` per utterance with beamkit's ``Decoder.decode`` (all utterances in one call, spread over
one thread per core), plus the same call on one thread and one call per utterance; with the LM also one call
per utterance starting from an empty LM cache (beamkit keeps the words its LM scored across calls, pyctcdecode
does not, and the repeated runs would otherwise all find them). Every timing is the best of ``--repeats`` runs
(default 3), each run starting after a full garbage collection; the contenders' runs are interleaved, so that
a busy spell of a shared machine slows them alike.

The hotword sweep (``--hotwords 0,10,100,1000,10000``) times one call per utterance with hotword lists of
each size (real words from the same word list, every tenth entry a two-word phrase), for beamkit's
``Decoder``, its pyctcdecode drop-in and pyctcdecode itself (up to ``--pc-hotwords-max`` hotwords, 100 by
default: its cost grows with the list), each against itself without hotwords, with the drop-in's agreement
with pyctcdecode and the share of texts the hotwords changed.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import math
import os
import sys
import tempfile
import time
from typing import Any

import numpy as np

LABELS = ["", " ", *"abcdefghijklmnopqrstuvwxyz", "'", "-"]
T_FRAMES = 200


def load_wordsegment(top: int) -> tuple[list[str], np.ndarray, dict[str, tuple[list[str], np.ndarray]]]:
    """Top ``top`` lowercase words with unigram counts, and bigram successors restricted to them."""
    import wordsegment

    base = os.path.dirname(wordsegment.__file__)
    words: list[str] = []
    counts: list[float] = []
    with open(os.path.join(base, "unigrams.txt"), encoding="utf-8") as fh:
        for line in fh:
            w, c = line.split("\t")
            if w.isalpha() and w.isascii() and (len(w) > 1 or w in ("a", "i")):
                words.append(w)
                counts.append(float(c))
            if len(words) >= top:
                break
    vocab = set(words)
    succ: dict[str, tuple[list[str], list[float]]] = {}
    with open(os.path.join(base, "bigrams.txt"), encoding="utf-8") as fh:
        for line in fh:
            pair, c = line.split("\t")
            a, _, b = pair.partition(" ")
            if a in vocab and b in vocab:
                entry = succ.setdefault(a, ([], []))
                entry[0].append(b)
                entry[1].append(float(c))
    succ_np = {a: (ws, np.array(cs) / sum(cs)) for a, (ws, cs) in succ.items()}
    uni = np.array(counts) / sum(counts)
    return words, uni, succ_np


def sample_sentence(rng: np.random.Generator, words: list[str], uni: np.ndarray, succ: dict, n_words: int) -> str:
    """A sentence from the bigram chain (falls back to unigrams)."""
    out = [words[rng.choice(len(words), p=uni)]]
    while len(out) < n_words:
        nxt = succ.get(out[-1])
        if nxt is not None and rng.random() < 0.8:
            out.append(nxt[0][rng.choice(len(nxt[0]), p=nxt[1])])
        else:
            out.append(words[rng.choice(len(words), p=uni)])
    return " ".join(out)


def make_posteriors(rng: np.random.Generator, text: str, T: int = T_FRAMES) -> np.ndarray:
    """Peaky ``(T, 30)`` log-probabilities whose best path spells ``text`` (plus realistic confusions)."""
    V = len(LABELS)
    ids = [LABELS.index(c) for c in text]
    path: list[int] = []
    prev = -1
    budget = T - len(ids) * 2
    for i in ids:
        if i == prev or rng.random() < 0.6:
            path.extend([0] * int(rng.integers(1, 3)))
        path.extend([i] * int(rng.integers(1, 3 if budget > 0 else 2)))
        prev = i
    path = path[:T]
    pad = T - len(path)
    cut = int(rng.integers(0, pad + 1))
    path = [0] * cut + path + [0] * (pad - cut)
    probs = rng.dirichlet(np.full(V, 0.3), size=T) * 0.005  # shape: (T, V) background mass
    for t, lab in enumerate(path):
        peak = rng.uniform(0.6, 0.99)
        if lab != 0 and rng.random() < 0.15:  # a confusable letter takes a big share (sometimes most)
            other = int(rng.integers(2, 28))
            share = rng.uniform(0.2, 0.6)
            probs[t, other] += peak * share
            peak *= 1 - share
        elif rng.random() < 0.1:  # an uncertain frame: some mass on another label
            probs[t, int(rng.integers(0, V))] += rng.uniform(0.01, 0.2)
        probs[t, lab] += peak
    probs /= probs.sum(axis=1, keepdims=True)
    return np.log(probs)


def build_lm(words: list[str], uni: np.ndarray, succ: dict, workdir: str, seed: int, n_sent: int) -> str:
    """Sample a corpus and run ``beamkit lm build corpus.txt --order 3 -o lm.arpa``."""
    from beamkit.cli import ctc as ctc_cli

    rng = np.random.default_rng(seed + 1)
    corpus = os.path.join(workdir, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as fh:
        for _ in range(n_sent):
            fh.write(sample_sentence(rng, words, uni, succ, int(rng.integers(4, 13))) + "\n")
    arpa = os.path.join(workdir, "lm.arpa")
    parser = argparse.ArgumentParser()
    ctc_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["lm", "build", corpus, "--order", "3", "-o", arpa])
    rc = args.func(args)
    if rc != 0:
        raise SystemExit(f"lm build failed with exit code {rc}")
    return arpa


def best_of(repeats: int, run):
    """``(seconds, output)`` of the fastest of ``repeats`` calls of ``run()``; each call starts after a full
    garbage collection, so that it pays for its own garbage only, not for what an earlier run left."""
    best = math.inf
    out = None
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        out = run()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _threads(n: int) -> int:
    """Threads ``Decoder.decode`` uses for ``n`` utterances by default."""
    from beamkit.ctc.prefix.run import thread_count

    return thread_count(None, n)


def best_texts(hypotheses: list[list[Any]]) -> list[str]:
    """The best hypothesis's text of each utterance (empty when an utterance has none)."""
    return [hyps[0].text if hyps else "" for hyps in hypotheses]


def native_decoder(lm: Any = None) -> Any:
    """beamkit's native :class:`beamkit.ctc.Decoder` set up as pyctcdecode's ``decode`` searches: beam 100,
    history pruning on, its end-of-utterance rule (for the same top-1), the best hypothesis only."""
    from beamkit.ctc import CTCOptions, Decoder

    options = CTCOptions(beam_width=100, prune_history=True, pyctcdecode_compat=True, num_hypotheses=1)
    return Decoder(LABELS, lm, options)


def interleaved(repeats: int, runs: dict[str, Any]) -> tuple[dict[str, float], dict[str, Any]]:
    """``(seconds, output)`` per name of the fastest of ``repeats`` calls of each ``runs[name]()``, the runs
    interleaved (each repeat calls every run once, in turn), so that a busy spell of a shared machine slows
    every contender alike instead of one of them; each call starts after a full garbage collection."""
    best = dict.fromkeys(runs, math.inf)
    outs: dict[str, Any] = {}
    for _ in range(repeats):
        for name, run in runs.items():
            gc.collect()
            t0 = time.perf_counter()
            outs[name] = run()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best, outs


def per_utterance_cold(name: str, make_pc, make_bk, utts: list[np.ndarray], repeats: int) -> float:
    """The figure a user sees: fresh decoders (beamkit's LM cache empty), one call per utterance, each utterance
    decoded once, the two alternating utterance by utterance (which goes first alternates too). Prints and returns
    the median ratio of ``repeats`` such runs."""
    ratios, t_pc, t_bk = [], 0.0, 0.0
    for _ in range(repeats):
        pc, bk = make_pc(), make_bk()
        t_pc = t_bk = 0.0
        gc.collect()
        for i, x in enumerate(utts):
            for side in (0, 1) if i % 2 == 0 else (1, 0):
                t0 = time.perf_counter()
                if side == 0:
                    pc.decode(x, beam_width=100)
                    t_pc += time.perf_counter() - t0
                else:
                    bk.decode([x])
                    t_bk += time.perf_counter() - t0
        ratios.append(t_pc / t_bk)
    ratios.sort()
    n = len(utts)
    print(
        f"ctc-speedup-per-utterance[{name}]: {ratios[len(ratios) // 2]:.1f}x (cold, one call per utterance, "
        f"interleaved; last run pyctcdecode {1e3 * t_pc / n:.1f} ms/utt, beamkit {1e3 * t_bk / n:.2f} ms/utt; "
        f"runs {', '.join(f'{r:.1f}' for r in ratios)})"
    )
    return ratios[len(ratios) // 2]


def run_setting(
    name: str, pc_decoder, bk_decoder, utts: list[np.ndarray], refs: list[str], repeats: int = 3, cold=None
) -> dict:
    """Time both decoders on ``utts`` (best of ``repeats`` interleaved runs each); return figures and print
    the summary line. ``cold``: a function returning a fresh beamkit decoder whose LM cache is empty (its
    single-utterance pass is timed too: beamkit keeps scored words across calls, pyctcdecode does not)."""
    runs = {
        "pc": lambda: [pc_decoder.decode(x, beam_width=100) for x in utts],
        "batch": lambda: best_texts(bk_decoder.decode(utts)),
        "one": lambda: best_texts(bk_decoder.decode(utts, threads=1)),
        "single": lambda: [best_texts(bk_decoder.decode([x]))[0] for x in utts],
    }
    if cold is not None:

        def cold_pass() -> list[str]:
            fresh = cold()
            t0 = time.perf_counter()
            out = [best_texts(fresh.decode([x]))[0] for x in utts]
            cold_pass.seconds = min(getattr(cold_pass, "seconds", math.inf), time.perf_counter() - t0)
            return out

        runs["cold"] = cold_pass
    secs, outs = interleaved(repeats, runs)
    t_pc, t_bk_batch, t_bk_one, t_bk_single = (secs[k] / len(utts) for k in ("pc", "batch", "one", "single"))
    pc_out, bk_batch, bk_single = outs["pc"], outs["batch"], outs["single"]
    agree = np.mean([a == b for a, b in zip(pc_out, bk_batch, strict=False)]) * 100
    agree_single = np.mean([a == b for a, b in zip(pc_out, bk_single, strict=False)]) * 100
    wer_pc = np.mean([a != r for a, r in zip(pc_out, refs, strict=False)]) * 100
    wer_bk = np.mean([a != r for a, r in zip(bk_batch, refs, strict=False)]) * 100
    print(f"ctc-speedup[{name}]: {t_pc / t_bk_batch:.1f}x, agreement {agree:.1f}%")
    print(
        f"  pyctcdecode {t_pc * 1e3:.1f} ms/utt; beamkit batched {t_bk_batch * 1e3:.2f} ms/utt "
        f"({_threads(len(utts))} threads; one thread {t_bk_one * 1e3:.2f} ms/utt, {t_pc / t_bk_one:.1f}x), "
        f"single-utterance {t_bk_single * 1e3:.2f} ms/utt ({t_pc / t_bk_single:.1f}x, "
        f"agreement {agree_single:.1f}%); sentence error vs reference: pyctcdecode {wer_pc:.1f}%, "
        f"beamkit {wer_bk:.1f}%"
    )
    if cold is not None:
        t_cold = cold_pass.seconds / len(utts)
        agree_cold = np.mean([a == b for a, b in zip(pc_out, outs["cold"], strict=False)]) * 100
        print(
            f"  single-utterance from an empty LM cache {t_cold * 1e3:.2f} ms/utt ({t_pc / t_cold:.1f}x, "
            f"agreement {agree_cold:.1f}%)"
        )
    for a, b, r in list(zip(pc_out, bk_batch, refs, strict=False))[:200]:
        if a != b:
            print(f"  differ: ref={r!r}\n          pyctcdecode={a!r}\n          beamkit    ={b!r}")
    return {"speedup": t_pc / t_bk_batch, "agreement": agree, "single_s": t_bk_single, "out": bk_single}


def hotword_lists(words: list[str], sizes: list[int], seed: int) -> dict[int, list[str]]:
    """Hotword lists of each size, each the start of one shuffled list of ``words``: every tenth entry is a
    two-word phrase (pyctcdecode scores a phrase word by word, and so does beamkit)."""
    rng = np.random.default_rng(seed + 2)
    pool = [words[i] for i in rng.permutation(len(words))]
    entries: list[str] = []
    for i in range(max(sizes, default=0)):
        w = pool[i % len(pool)]
        entries.append(f"{w} {pool[(i + 1) % len(pool)]}" if i % 10 == 9 else w)
    return {n: entries[:n] for n in sizes}


def hotword_sweep(
    name: str, pc_decoder, labels_lm: dict, utts: list[np.ndarray], lists: dict[int, list[str]], repeats: int,
    pc_max: int,
) -> None:  # fmt: skip
    """Time one call per utterance with 0, 10, 100, ... hotwords: beamkit's :class:`Decoder` (the list in its
    options), beamkit's pyctcdecode drop-in (``decode(x, hotwords=...)``, the list passed on every call, as
    pyctcdecode's users do) and pyctcdecode itself (up to ``pc_max`` hotwords: its cost grows with the list);
    prints each against the same decoder without hotwords, and the drop-in's agreement with pyctcdecode."""
    from beamkit.ctc import CTCOptions, Decoder
    from beamkit.ctc.compat import build_ctcdecoder

    base = CTCOptions(beam_width=100, prune_history=True, pyctcdecode_compat=True, num_hypotheses=1)
    native = Decoder(LABELS, labels_lm.get("fusion"), base)
    compat = build_ctcdecoder(LABELS, **labels_lm.get("compat", {}))
    runs: dict[str, Any] = {}
    for n, hot in lists.items():
        opts = CTCOptions(
            beam_width=100, prune_history=True, pyctcdecode_compat=True, num_hypotheses=1, hotwords=hot or None
        )
        runs[f"native/{n}"] = lambda opts=opts: [best_texts(native.decode([x], opts))[0] for x in utts]
        # weight 0: the same search as without hotwords, with the whole trie carried along (the cost of the
        # hotword machinery alone, apart from what the bonuses change in the search)
        zero = dataclasses.replace(opts, hotword_weight=0.0)
        runs[f"zero/{n}"] = lambda zero=zero: [best_texts(native.decode([x], zero))[0] for x in utts]
        runs[f"compat/{n}"] = lambda hot=hot: [compat.decode(x, beam_width=100, hotwords=hot) for x in utts]
        if n <= pc_max:
            runs[f"pc/{n}"] = lambda hot=hot: [pc_decoder.decode(x, beam_width=100, hotwords=hot) for x in utts]
    secs, outs = interleaved(repeats, runs)
    per = {k: v / len(utts) * 1e3 for k, v in secs.items()}
    print(f"hotword sweep [{name}] (one call per utterance, ms/utt; x: against the same decoder without hotwords)")
    for n in lists:
        same = np.mean([a == b for a, b in zip(outs[f"zero/{n}"], outs["zero/0"], strict=True)]) * 100
        line = (
            f"  {n:>6} hotwords: beamkit {per[f'native/{n}']:.2f} ({per[f'native/{n}'] / per['native/0']:.2f}x; "
            f"weight 0: {per[f'zero/{n}']:.2f}, {per[f'zero/{n}'] / per['zero/0']:.2f}x, same texts {same:.0f}%), "
            f"drop-in {per[f'compat/{n}']:.2f} ({per[f'compat/{n}'] / per['compat/0']:.2f}x)"
        )
        if f"pc/{n}" in per:
            agree = np.mean([a == b for a, b in zip(outs[f"pc/{n}"], outs[f"compat/{n}"], strict=True)]) * 100
            changed = np.mean([a != b for a, b in zip(outs[f"pc/{n}"], outs["pc/0"], strict=True)]) * 100
            line += (
                f", pyctcdecode {per[f'pc/{n}']:.1f} ({per[f'pc/{n}'] / per['pc/0']:.2f}x; drop-in agreement "
                f"{agree:.1f}%, {changed:.0f}% of texts changed by the hotwords)"
            )
        print(line)


def flashlight_column(utts: list[np.ndarray], refs: list[str], bk_out: list[str], bk_single_s: float, repeats: int):
    """flashlight-text's ``LexiconFreeDecoder`` (CTC, no LM, beam 100, threshold 10 like pyctcdecode's
    ``beam_prune_logp=-10``, log-add merging) on the same utterances, one per call; prints its time per
    utterance against beamkit's single-utterance ``decode`` and its agreement with beamkit."""
    try:
        from flashlight.lib.text.decoder import (
            CriterionType,
            LexiconFreeDecoder,
            LexiconFreeDecoderOptions,
            ZeroLM,
        )
    except ImportError:
        print("flashlight-text is not installed (pip install flashlight-text): no flashlight column")
        return
    V = len(LABELS)
    opts = LexiconFreeDecoderOptions(
        beam_size=100,
        beam_size_token=V,
        beam_threshold=10.0,
        lm_weight=0.0,
        sil_score=0.0,
        log_add=True,
        criterion_type=CriterionType.CTC,
    )
    decoder = LexiconFreeDecoder(opts, ZeroLM(), LABELS.index(" "), 0, [])
    mats = [np.ascontiguousarray(u, dtype=np.float32) for u in utts]

    def text_of(tokens) -> str:
        out, prev = [], -1
        for t in tokens:
            if t != prev and t != 0:
                out.append(LABELS[t])
            prev = t
        return " ".join("".join(out).split())

    def run():
        return [text_of(decoder.decode(m.ctypes.data, m.shape[0], V)[0].tokens) for m in mats]

    t_fl, fl_out = best_of(repeats, run)
    t_fl /= len(utts)
    agree = np.mean([a == b for a, b in zip(fl_out, bk_out, strict=True)]) * 100
    wer = np.mean([a != r for a, r in zip(fl_out, refs, strict=True)]) * 100
    print(
        f"  flashlight-text LexiconFreeDecoder {t_fl * 1e3:.1f} ms/utt; beamkit single-utterance is "
        f"{t_fl / bk_single_s:.2f}x its speed; agreement with beamkit {agree:.1f}%, sentence error {wer:.1f}%"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--utterances", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--top-words", type=int, default=10000)
    p.add_argument("--corpus-sentences", type=int, default=30000)
    p.add_argument("--beamkit-lm", choices=["auto", "arpa", "kenlm"], default="auto")
    p.add_argument("--quick", action="store_true", help="skip the LM setting")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per decoder and setting (the best counts)")
    p.add_argument("--hotwords", default="0,10,100,1000,10000", help="hotword list sizes of the sweep ('': none)")
    p.add_argument("--pc-hotwords-max", type=int, default=100, help="largest list pyctcdecode is timed with")
    args = p.parse_args(argv)
    sizes = sorted({0, *(int(n) for n in args.hotwords.split(",") if n.strip())}) if args.hotwords else []
    logging.disable(logging.WARNING)
    import pyctcdecode

    from beamkit.ctc import fusion_of
    from beamkit.lm import kenlm_available, load_unigrams_from_arpa

    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    words, uni, succ = load_wordsegment(args.top_words)
    refs = [sample_sentence(rng, words, uni, succ, int(rng.integers(4, 9))) for _ in range(args.utterances)]
    utts = [make_posteriors(rng, r) for r in refs]
    print(
        f"data: {len(utts)} utterances, T={T_FRAMES}, V={len(LABELS)}, beam_width=100 "
        f"(prepared in {time.perf_counter() - t0:.1f}s)"
    )
    # warm-up (imports, first allocations) on both sides
    pc0 = pyctcdecode.build_ctcdecoder(LABELS)
    bk0 = native_decoder()
    pc0.decode(utts[0])
    bk0.decode(utts[:2])
    plain = run_setting("no-lm", pc0, bk0, utts, refs, args.repeats)
    per_utterance_cold("no-lm", lambda: pyctcdecode.build_ctcdecoder(LABELS), native_decoder, utts, args.repeats)
    flashlight_column(utts, refs, plain["out"], plain["single_s"], args.repeats)
    lists = hotword_lists(load_wordsegment(max(sizes, default=0) + 10)[0], sizes, args.seed) if sizes else {}
    if lists:
        hotword_sweep("no-lm", pc0, {}, utts, lists, args.repeats, args.pc_hotwords_max)
    if args.quick:
        return 0
    with tempfile.TemporaryDirectory() as work:
        t0 = time.perf_counter()
        arpa = build_lm(words, uni, succ, work, args.seed, args.corpus_sentences)
        print(
            f"lm: beamkit lm build --order 3 on {args.corpus_sentences} sampled sentences: "
            f"{os.path.getsize(arpa) / 1e6:.1f} MB ARPA in {time.perf_counter() - t0:.1f}s"
        )
        if not kenlm_available():
            print("kenlm is not installed: pyctcdecode cannot use an LM; skipping the [lm] setting")
            return 0
        unigrams = load_unigrams_from_arpa(arpa)
        pc = pyctcdecode.build_ctcdecoder(LABELS, kenlm_model_path=arpa, unigrams=unigrams)
        fusion = fusion_of(arpa, unigrams, backend=args.beamkit_lm)  # pyctcdecode's default weights
        bk = native_decoder(fusion)
        pc.decode(utts[0])
        bk.decode(utts[:2])
        backend = type(fusion.model).__name__
        print(f"lm backend: pyctcdecode kenlm, beamkit {backend}")
        warm_up = make_posteriors(np.random.default_rng(args.seed + 3), "the")

        def cold_decoder():
            """A decoder over the loaded model whose LM cache is empty (one short utterance decoded)."""
            fresh = native_decoder(fusion_of(fusion.model, unigrams))
            fresh.decode([warm_up])
            return fresh

        run_setting("lm", pc, bk, utts, refs, args.repeats, cold=cold_decoder)
        per_utterance_cold(
            "lm",
            lambda: pc,  # pyctcdecode keeps nothing across calls: its loaded decoder is as cold as a new one
            lambda: native_decoder(fusion_of(fusion.model, unigrams)),
            utts,
            args.repeats,
        )
        if lists:
            lm_args = {"fusion": fusion, "compat": {"kenlm_model_path": arpa, "unigrams": unigrams}}
            hotword_sweep("lm", pc, lm_args, utts, lists, args.repeats, args.pc_hotwords_max)
    return 0


if __name__ == "__main__":
    sys.exit(main())
