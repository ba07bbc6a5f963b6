"""Benchmark: generative retrieval, beams constrained to a dictionary of semantic IDs (``beamkit.Trie``).

Three parts, one process:

1. **Trie build**: semantic IDs of ``--levels`` levels x 256 codes (level ``l``'s code ``c`` is token
   ``1 + 256 l + c``; 0 is the stop token), 100,000 and 1,000,000 distinct random items of ``levels`` tokens
   (``--levels 3,4``): build time and memory (the trie's arrays, and the peak of everything numpy allocated
   while building, traced with ``tracemalloc``).
2. **beamkit vs ``model.generate``** with the same callable (``trie.prefix_allowed_tokens_fn``): a random tiny
   GPT-2 (2 layers, n_embd 64, 2 heads, vocab ``1 + 256 * 4``, seed 0), ``--prompts`` prompts of
   ``--prompt-len`` tokens, ``--items`` items of 4 codes + the stop token, width 50, the width's n-best returned.
   Checks every beamkit output is in the dictionary; reports top-1 agreement, n-best overlap and the speed ratio
   (median of ``--repeats`` runs each, interleaved).
3. **Throughput by width** (beamkit): widths 50-400 on the same model and dictionary.
4. **The output layer over the allowed ids** (``beamkit.hf.generate(..., allowed_output=...)``): the full
   output layer against ``"vocab"`` (normalised over the vocabulary) and ``"allowed"`` (normalised over each
   row's allowed ids) at ``--width``, on models of ``--output-vocabs`` ids (the codes, then other ids: a
   language model with semantic-ID tokens added): time, and the n-best against the full layer's.

Prints a table per part, then the headline lines::

    trie-build[1000000x4]: 1.71 s, 26.5 MB arrays, 80.2 MB peak
    speedup[20000 items, width 50]: 31.2x (top-1 4/4, n-best overlap 98.5%)

Run: ``.venv/bin/python bench/generative_retrieval.py [--quick] [--threads 1]``. ``--quick`` (the test's
setting) shrinks everything to a few seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import tracemalloc
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

from beamkit import Trie  # noqa: E402

CODES, EOS = 256, 0


def semantic_ids(n: int, levels: int, seed: int = 0, stop: bool = False) -> np.ndarray:
    """``n`` distinct random semantic IDs ``[n, levels]`` (``+ 1`` column of the stop token with ``stop``):
    level ``l``'s code ``c`` is token ``1 + 256 l + c``."""
    rng = np.random.default_rng(seed)
    got = np.zeros((0, levels), np.int64)
    while got.shape[0] < n:
        more = rng.integers(0, CODES, (int((n - got.shape[0]) * 1.1) + 16, levels))
        got = np.unique(np.concatenate([got, more]), axis=0)
    got = got[rng.permutation(got.shape[0])[:n]] + 1 + CODES * np.arange(levels)
    if stop:
        got = np.concatenate([got, np.full((n, 1), EOS)], axis=1)
    return got


def build_row(n: int, levels: int) -> dict[str, Any]:
    """Build one trie, timed, with its memory."""
    items = semantic_ids(n, levels)
    tracemalloc.start()
    start = time.perf_counter()
    trie = Trie(items)
    seconds = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(trie) == n
    return {"items": n, "levels": levels, "seconds": seconds, "mb": trie.nbytes / 1e6, "peak_mb": peak / 1e6}


def tiny_gpt2(levels: int, positions: int, vocab: int | None = None) -> Any:
    """The random tiny GPT-2 every decoding run uses (seed 0); ``vocab``: its vocabulary (default the codes and
    the stop token; larger: the codes plus other ids, as a language model with semantic-ID tokens added)."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=2, vocab_size=vocab or 1 + CODES * levels, n_positions=positions,
        bos_token_id=EOS, eos_token_id=EOS,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(cfg).eval()


def prompts_of(count: int, length: int, vocab: int, seed: int = 1) -> Any:
    import torch

    return torch.randint(1, vocab, (count, length), generator=torch.Generator().manual_seed(seed))


def decode_kwargs(width: int, ids: Any) -> dict[str, Any]:
    import torch

    return dict(
        num_beams=width, num_return_sequences=width, max_new_tokens=5, eos_token_id=EOS, pad_token_id=EOS,
        attention_mask=torch.ones_like(ids), return_dict_in_generate=True,
    )  # fmt: skip


def compare(model: Any, trie: Trie, ids: Any, width: int, repeats: int) -> dict[str, Any]:
    """beamkit.hf.generate vs model.generate with the same callable: agreement and median times."""
    import torch

    import beamkit.hf as bh

    fn = trie.prefix_allowed_tokens_fn(prompt_len=ids.shape[1])
    kw = decode_kwargs(width, ids)
    times: dict[str, list[float]] = {"hf": [], "beamkit": []}
    outs: dict[str, Any] = {}
    with torch.inference_mode():
        for i in range(repeats):
            for side in ("hf", "beamkit") if i % 2 == 0 else ("beamkit", "hf"):
                start = time.perf_counter()
                if side == "hf":
                    outs[side] = model.generate(ids, prefix_allowed_tokens_fn=fn, **kw)
                else:
                    outs[side] = bh.generate(model, ids, prefix_allowed_tokens_fn=fn, **kw)
                times[side].append(time.perf_counter() - start)
    from beamkit.hf.bridge.route import route

    where = route(model, (ids,), {**kw, "prefix_allowed_tokens_fn": fn}).kind  # "engine": beamkit's batched search
    n, p = ids.shape
    mine = outs["beamkit"].sequences[:, p:].tolist()
    theirs = outs["hf"].sequences[:, p:].tolist()
    top1 = sum(mine[r * width] == theirs[r * width] for r in range(n))
    overlap = [len(_ids(mine, r, width) & _ids(theirs, r, width)) / width for r in range(n)]
    valid = all(list(row) in trie for row in mine if row)
    hf, bk = statistics.median(times["hf"]), statistics.median(times["beamkit"])
    return {
        "items": len(trie), "width": width, "prompts": n, "prompt_len": p, "hf_s": hf, "beamkit_s": bk,
        "speedup": hf / bk, "top1": top1, "overlap": statistics.mean(overlap), "valid": valid, "route": where,
    }  # fmt: skip


def _ids(rows: list[list[int]], request: int, width: int) -> set[tuple[int, ...]]:
    """The n-best of one request, as a set of ID tuples."""
    return {tuple(x) for x in rows[request * width : (request + 1) * width]}


def throughput(model: Any, trie: Trie, ids: Any, width: int, repeats: int) -> dict[str, Any]:
    """beamkit.hf.generate's requests per second at one width."""
    import torch

    import beamkit.hf as bh

    fn = trie.prefix_allowed_tokens_fn(prompt_len=ids.shape[1])
    kw = decode_kwargs(width, ids)
    runs = []
    with torch.inference_mode():
        for _ in range(repeats):
            start = time.perf_counter()
            out = bh.generate(model, ids, prefix_allowed_tokens_fn=fn, **kw)
            runs.append(time.perf_counter() - start)
    seconds = statistics.median(runs)
    valid = all(list(row) in trie for row in out.sequences[:, ids.shape[1] :].tolist() if row)
    return {"width": width, "seconds": seconds, "requests_per_s": ids.shape[0] / seconds, "valid": valid}


def output_layer(
    vocab: int, trie: Trie, prompts: int, prompt_len: int, width: int, repeats: int
) -> list[dict[str, Any]]:
    """``allowed_output=`` against the full output layer on a model of ``vocab`` ids: median seconds of each
    (interleaved), and how the n-best of each mode compares with the full layer's (top-1, overlap, scores)."""
    import torch

    import beamkit.hf as bh

    model = tiny_gpt2(4, prompt_len + 8, vocab)
    ids = prompts_of(prompts, prompt_len, vocab)
    fn = trie.prefix_allowed_tokens_fn(prompt_len=prompt_len)
    kw = decode_kwargs(width, ids)
    modes = (None, "vocab", "allowed")
    times: dict[Any, list[float]] = {m: [] for m in modes}
    outs: dict[Any, Any] = {}
    with torch.inference_mode():
        for i in range(repeats):
            for mode in modes if i % 2 == 0 else modes[::-1]:
                start = time.perf_counter()
                outs[mode] = bh.generate(model, ids, prefix_allowed_tokens_fn=fn, allowed_output=mode, **kw)
                times[mode].append(time.perf_counter() - start)
    full = outs[None].sequences[:, prompt_len:].tolist()
    n, rows = prompts, []
    for mode in modes:
        mine = outs[mode].sequences[:, prompt_len:].tolist()
        gap = max(
            abs(a.logprob - b.logprob)
            for x, y in zip(outs[mode].hypotheses, outs[None].hypotheses, strict=True)
            for a, b in zip(x, y, strict=False)
            if a.tokens == b.tokens
        )
        rows.append({
            "vocab": vocab, "mode": mode or "full", "seconds": statistics.median(times[mode]),
            "speedup": statistics.median(times[None]) / statistics.median(times[mode]),
            "top1": sum(mine[r * width] == full[r * width] for r in range(prompts)), "prompts": prompts,
            "overlap": statistics.mean(len(_ids(mine, r, width) & _ids(full, r, width)) / width for r in range(n)),
            "score_gap": gap, "valid": all(list(row) in trie for row in mine if row),
        })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the three parts; print the tables and the headline; return the rows (for the test)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a few seconds (the test's setting)")
    parser.add_argument("--build-items", default="100000,1000000", help="trie sizes to build")
    parser.add_argument("--levels", default="3,4", help="levels of the semantic IDs built in part 1")
    parser.add_argument("--items", type=int, default=20000, help="dictionary size of parts 2 and 3")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--width", type=int, default=50, help="width of the comparison with model.generate")
    parser.add_argument("--widths", default="50,100,200,400", help="widths of the throughput table")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--output-vocabs", default="1025,32768", help="model vocabularies of the output-layer comparison (part 4)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: tiny model, shared machine)")
    args = parser.parse_args(argv)
    if args.quick:
        args.build_items, args.levels, args.items, args.prompts = "2000", "3", 500, 2
        args.prompt_len, args.width, args.widths, args.repeats = 16, 8, "8,16", 1
        args.output_vocabs = "1025"
    import torch

    torch.set_num_threads(args.threads)
    builds = [build_row(int(n), int(lv)) for lv in args.levels.split(",") for n in args.build_items.split(",")]
    print("| items | levels | build s | arrays MB | peak MB while building |")
    print("|---:|---:|---:|---:|---:|")
    for b in builds:
        print(f"| {b['items']:,} | {b['levels']} | {b['seconds']:.2f} | {b['mb']:.1f} | {b['peak_mb']:.1f} |")
    trie = Trie(semantic_ids(args.items, 4, seed=2, stop=True))
    model = tiny_gpt2(4, args.prompt_len + 8)
    ids = prompts_of(args.prompts, args.prompt_len, 1 + CODES * 4)
    cmp = compare(model, trie, ids, args.width, args.repeats)
    print()
    print("| items | width | prompts x tokens | model.generate s | beamkit s | speedup | top-1 same | n-best overlap |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|")
    print(
        f"| {cmp['items']:,} | {cmp['width']} | {cmp['prompts']} x {cmp['prompt_len']} | {cmp['hf_s']:.3f} | "
        f"{cmp['beamkit_s']:.3f} | {cmp['speedup']:.1f}x | {cmp['top1']}/{cmp['prompts']} | "
        f"{100 * cmp['overlap']:.1f}% |"
    )
    rates = [throughput(model, trie, ids, int(w), args.repeats) for w in args.widths.split(",")]
    print()
    print("| width | beamkit s per batch | requests/s | outputs in the dictionary |")
    print("|---:|---:|---:|---|")
    for r in rates:
        print(f"| {r['width']} | {r['seconds']:.3f} | {r['requests_per_s']:.2f} | {'yes' if r['valid'] else 'NO'} |")
    layers = [
        row
        for v in args.output_vocabs.split(",")
        for row in output_layer(int(v), trie, args.prompts, args.prompt_len, args.width, args.repeats)
    ]
    print()
    print(
        "| vocabulary | output layer | beamkit s | vs full layer | top-1 as full | n-best as full | max score change |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|")
    for r in layers:
        print(
            f"| {r['vocab']:,} | {r['mode']} | {r['seconds']:.3f} | {r['speedup']:.2f}x | {r['top1']}/{r['prompts']} | "
            f"{100 * r['overlap']:.1f}% | {r['score_gap']:.2g} |"
        )
    print()
    for b in builds:
        print(
            f"trie-build[{b['items']}x{b['levels']}]: {b['seconds']:.2f} s, {b['mb']:.1f} MB arrays, "
            f"{b['peak_mb']:.1f} MB peak"
        )
    print(
        f"speedup[{cmp['items']} items, width {cmp['width']}]: {cmp['speedup']:.1f}x (top-1 "
        f"{cmp['top1']}/{cmp['prompts']}, n-best overlap {100 * cmp['overlap']:.1f}%, all outputs valid: "
        f"{cmp['valid'] and all(r['valid'] for r in rates)})"
    )
    return {"builds": builds, "compare": cmp, "throughput": rates, "output_layer": layers}


if __name__ == "__main__":
    main()
