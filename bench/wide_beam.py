"""Wide beams over long prompts: shared-prefix attention against ``model.generate`` and the gathering path.

An untrained GPT-2 built from a config (4 layers, 256 wide, 4 heads, vocabulary 8192, ``torch.manual_seed(0)``,
offline), float32, one torch thread. Each run decodes ``--requests`` prompts of random tokens at beam width W,
all W hypotheses returned (``num_return_sequences=W``), no stop token, so every beam runs ``--new`` tokens.
Three decoders of the same call, each timed in process CPU seconds (one thread: on a shared machine wall time
mostly measures the neighbours; the figures are still noisy there, run it on an idle machine for print):

- **beamkit**: ``beamkit.hf.generate`` (paged keys/values, shared-prefix attention: a request's beams read
  their common prompt blocks once per layer and step, in place, and gather only their own tails);
- **gather**: the same with the paged step's gathering path (every row's keys/values copied into
  ``[rows, heads, L, d]`` for the model's SDPA: beamkit before shared-prefix attention);
- **hf**: ``model.generate`` (it runs the prompt once per beam), only up to ``--hf-max`` (it takes 15-100 s
  per run at widths 100-200 here).

The **floating-point limit** of a shape is the multiply-adds beamkit's call must do (the prompt once per
request, then every step's rows through the layers, attention over their context and the output layer) over
the multiply-add rate of a 1024 x 1024 x 1024 float32 matrix product measured in the same run; ``x limit`` is
beamkit's time over it. Tokens: beamkit's must equal the gathering path's, and top-1 Hugging Face's (the
n-best agreement is printed; differences fall on float32 near-ties of the scores). Throughput is generated
tokens (requests x W x new) per CPU second.

Prints a table per prompt length, then the targets::

    wide-beam[vs-hf,w100,p256]: 31.0x (target >= 30x)
    wide-beam[w200/w10,p256]: 4.2x (target <= 6x)
    wide-beam[limit,w100,p256]: 1.6x (target <= 2x)
    wide-beam[vs-gather,w8,p256]: 0.8x (target <= 1x: ordinary beams no slower)

    python bench/wide_beam.py [--full] [--widths 8,10,100,200] [--prompts 256] [--new 4] [--hf-max 100]

Defaults finish in a few minutes; ``--full`` sweeps widths 8-400 and 1,000 (beamkit only), prompts 256 and
1,024, 4 and 16 new tokens, Hugging Face up to width 200 at prompt 256 and 100 at 1,024.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from typing import Any
from unittest import mock

import torch
import transformers

import beamkit.hf as bh
import beamkit.hf.bridge.generation as generation

VOCAB = 8192
LAYERS, WIDTH, HEADS = 4, 256, 4


def build_model() -> Any:
    """The untrained GPT-2 of the benchmark (seeded, from a config), no stop token."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=LAYERS, n_embd=WIDTH, n_head=HEADS, vocab_size=VOCAB, n_positions=2048, bos_token_id=1,
        eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(cfg).eval()
    model.generation_config.eos_token_id = None
    return model


def matmul_rate(seconds: float = 1.0) -> float:
    """Multiply-adds per CPU second of a 1024 x 1024 x 1024 float32 matrix product (the best of a few)."""
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    torch.mm(a, b)
    best, spent = 0.0, 0.0
    while spent < seconds:
        start = time.process_time()
        torch.mm(a, b)
        took = time.process_time() - start
        spent += took
        best = max(best, 1024**3 / max(took, 1e-9))
    return best


def multiply_adds(requests: int, width: int, prompt: int, new: int) -> float:
    """Multiply-adds of beamkit's call: each prompt's forward once (its last position through the output layer),
    then ``new - 1`` steps of ``requests * width`` rows over a context growing from ``prompt + 1``."""
    d, layers = WIDTH, LAYERS
    per_token = 12 * d * d * layers  # attention projections 4 d^2 and the 4x feed-forward 8 d^2, per layer
    total = requests * (prompt * per_token + layers * prompt * prompt * d + d * VOCAB)  # causal QK and PV
    for t in range(1, new):
        context = prompt + t
        total += requests * width * (per_token + 2 * context * d * layers + d * VOCAB)
    return float(total)


def timed(fn: Any) -> tuple[Any, float]:
    """(fn(), CPU seconds)."""
    start = time.process_time()
    out = fn()
    return out, time.process_time() - start


def run(model: Any, ids: torch.Tensor, width: int, new: int, how: str) -> tuple[Any, float]:
    """One decoding of the call by ``how`` ("beamkit", "gather" or "hf"): (output, CPU seconds)."""
    kw = dict(
        num_beams=width, num_return_sequences=width, max_new_tokens=new, pad_token_id=0, eos_token_id=None,
        do_sample=False, return_dict_in_generate=True, output_scores=True,
    )  # fmt: skip
    mask = torch.ones_like(ids)
    if how == "hf":
        with torch.inference_mode():
            return timed(lambda: model.generate(ids, attention_mask=mask, **kw))
    attention = "gather" if how == "gather" else "shared-prefix"
    step = functools.partial(bh.DecoderOnlyStep, attention=attention)
    with mock.patch.object(generation, "DecoderOnlyStep", step):
        return timed(lambda: generation.prepare(model, ids, mask, kw, exact_only=False)())


def nbest(out: Any, width: int) -> list[list[tuple[int, ...]]]:
    """Per request, its hypotheses' tokens in output order."""
    rows = [tuple(r) for r in out.sequences.tolist()]
    return [rows[i : i + width] for i in range(0, len(rows), width)]


def differences(out: Any, ref: Any, width: int, tol: float = 1e-4) -> tuple[int, int]:
    """(hypotheses of ``out`` missing from ``ref``'s n-best, those of them not at a near-tie): a hypothesis
    scored within ``tol`` of the lower n-best edge may be swapped for another one by float32 rounding."""
    missing = near = 0
    scores = out.sequences_scores.tolist()
    for k, (mine, theirs) in enumerate(zip(nbest(out, width), nbest(ref, width), strict=True)):
        edge = min(scores[k * width : (k + 1) * width])
        ref_edge = min(ref.sequences_scores[k * width : (k + 1) * width].tolist())
        for j, tokens in enumerate(mine):
            if tokens not in set(theirs):
                missing += 1
                near += abs(scores[k * width + j] - max(edge, ref_edge)) < tol
    return missing, missing - near


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="the whole sweep (tens of minutes with Hugging Face)")
    ap.add_argument("--widths", default="8,10,100,200")
    ap.add_argument("--prompts", default="256")
    ap.add_argument("--new", default="4", help="new tokens, comma-separated")
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--hf-max", type=int, default=100, help="widest beam model.generate runs (prompt 256)")
    ap.add_argument("--repeats", type=int, default=1, help="beamkit runs per cell (the median is kept)")
    args = ap.parse_args()
    if args.full:
        args.widths, args.prompts, args.new, args.hf_max = "8,10,50,100,200,400,1000", "256,1024", "4,16", 200
    widths = [int(w) for w in args.widths.split(",")]
    torch.set_num_threads(1)
    model = build_model()
    rate = matmul_rate()
    print(f"matrix-product rate: {rate / 1e9:.1f} G multiply-adds per CPU second (one thread)")
    gen = torch.Generator().manual_seed(0)
    run(model, torch.randint(3, VOCAB, (1, 32), generator=gen), 4, 2, "beamkit")  # warm-up
    run(model, torch.randint(3, VOCAB, (1, 32), generator=gen), 4, 2, "gather")
    figures: list[str] = []
    for new in (int(n) for n in args.new.split(",")):
        for prompt in (int(p) for p in args.prompts.split(",")):
            ids = torch.randint(3, VOCAB, (args.requests, prompt), generator=gen)
            hf_max = args.hf_max if prompt <= 256 else args.hf_max // 2
            print(
                f"\n{args.requests} prompts x {prompt} tokens, {new} new tokens, all W hypotheses returned "
                f"(CPU seconds, one thread)"
            )
            print("| width | beamkit | tokens/s | gather | hf | vs gather | vs hf | limit | x limit | n-best = hf |")
            print("|---|---|---|---|---|---|---|---|---|---|")
            seconds: dict[int, float] = {}
            for w in widths:
                runs = [run(model, ids, w, new, "beamkit") for _ in range(args.repeats)]
                out, bk = runs[0][0], statistics.median(t for _, t in runs)
                seconds[w] = bk
                g_out, g = run(model, ids, w, new, "gather") if w <= 400 else (None, float("nan"))
                if g_out is not None:
                    missing, not_near = differences(out, g_out, w)
                    if missing:
                        figures.append(
                            f"# width {w}, prompt {prompt}: {missing} of {w * args.requests} hypotheses differ from "
                            f"the gathering path's, {not_near} of them not at a float32 near-tie"
                        )
                hf, agree = float("nan"), "-"
                if w <= hf_max:
                    h_out, hf = run(model, ids, w, new, "hf")
                    mine, theirs = nbest(out, w), nbest(h_out, w)
                    if any(m[0] != t[0] for m, t in zip(mine, theirs, strict=True)):
                        figures.append(f"# width {w}, prompt {prompt}: top-1 differs from Hugging Face's")
                    missing, not_near = differences(out, h_out, w)
                    agree = f"{100 * (1 - missing / (w * args.requests)):.1f} %" + (
                        f" ({not_near} not near-ties)" if not_near else ""
                    )
                limit = multiply_adds(args.requests, w, prompt, new) / rate
                tps = args.requests * w * new / bk
                print(
                    f"| {w} | {bk:.2f} s | {tps:,.0f} | {g:.2f} s | {hf:.1f} s | {g / bk:.1f}x | {hf / bk:.1f}x | "
                    f"{limit:.2f} s | {bk / limit:.1f}x | {agree} |"
                )
                tag = f"w{w},p{prompt}" + ("" if new == 4 else f",n{new}")
                if w <= hf_max and w >= 100:
                    figures.append(f"wide-beam[vs-hf,{tag}]: {hf / bk:.1f}x (target >= 30x)")
                if w >= 100:
                    figures.append(f"wide-beam[limit,{tag}]: {bk / limit:.1f}x (target <= 2x)")
                if w <= 8:
                    figures.append(f"wide-beam[vs-gather,{tag}]: {bk / g:.2f}x (target <= 1x: ordinary beams)")
            if 10 in seconds and 200 in seconds:
                suffix = f"p{prompt}" + ("" if new == 4 else f",n{new}")
                figures.append(f"wide-beam[w200/w10,{suffix}]: {seconds[200] / seconds[10]:.1f}x (target <= 6x)")
    print()
    print("\n".join(figures))


if __name__ == "__main__":
    main()
