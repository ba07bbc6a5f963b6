"""Benchmark: where the paged key/value cache pays against the dense one, and whether the size rule picks it.

Untrained GPT-2 models built from configs (seed 0, vocabulary 1000, offline) of several sizes, one torch thread,
float32; 8 requests of ``P`` random prompt tokens through :class:`beamkit.Engine` with
:class:`beamkit.hf.DecoderOnlyStep` (``kv="paged"`` and ``kv="dense"``, each step function kept across runs, as
``beamkit.hf.generate`` sizes its pool once), beam 5, the pool policy, no stop token, 16 new tokens. Time per step:
process CPU time of the steps after the prompt forward over their count (one torch thread: on a shared machine
wall time mostly measures the neighbours), the median of ``--repeats`` interleaved runs after a warm-up of each.
For each size it prints the paged/dense ratio, the KV bytes per row that
:func:`beamkit.hf.bridge.generation.choose_cache`
weighs (every layer's keys and values at the prompt's length plus the new tokens) and the cache it picks::

    kv-choice[2x64,p16]: paged/dense 1.17x, 32 KiB a row -> dense: right

``right`` when the choice is the faster cache, or within 10 % of it (near the crossing repeated runs on a shared
machine land on either side of 1); the script exits 1 on a wrong one.
The threshold (``beamkit.hf.bridge.generation.DENSE_BELOW_BYTES``) was set from these figures.

    python bench/kv_choice.py [--repeats 3] [--sizes 2x64x16,2x64x32,2x64x128,4x128x64,6x512x64]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import torch
import transformers

from beamkit import Engine
from beamkit.hf import DecoderOnlyStep
from beamkit.hf.bridge.generation import DENSE_BELOW_BYTES, kv_row_bytes

BEAM, NEW, REQUESTS, VOCAB = 5, 16, 8, 1000
# within 10 %: either cache is right (near the crossing, runs on a shared machine went either way: 1.03x and
# 0.92x at 80 KiB a row, 0.97x and 1.06x at 112 KiB)
TIE = 0.10


def build(layers: int, width: int) -> Any:
    """An untrained GPT-2 of ``layers`` x ``width`` (heads of 64, at least 2), seeded."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=layers, n_embd=width, n_head=max(2, width // 64), vocab_size=VOCAB, n_positions=1024,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(cfg).eval()


def per_step(step: DecoderOnlyStep, batch: list[torch.Tensor]) -> float:
    """CPU seconds per engine step after the prompt forward, the requests decoded together."""
    engine = Engine(step, beam_size=BEAM, max_len=NEW, policy="pool")
    with torch.inference_mode():
        for ids in batch:
            engine.add(step.init_state(ids, torch.ones_like(ids)), 0, None)
        engine.step()  # the prompt forward, not timed
        cpu, calls = time.process_time(), 0
        while not engine.idle:
            engine.step()
            calls += 1
    return (time.process_time() - cpu) / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", default="2x64x16,2x64x32,2x64x128,4x128x64,6x512x64", help="layers x width x prompt")
    args = ap.parse_args()
    torch.set_num_threads(1)
    wrong = []
    for size in args.sizes.split(","):
        layers, width, prompt = (int(v) for v in size.split("x"))
        model = build(layers, width)
        g = torch.Generator().manual_seed(0)
        batch = [torch.randint(3, VOCAB, (1, prompt), generator=g) for _ in range(REQUESTS)]
        steps = {kv: DecoderOnlyStep(model, kv) for kv in ("paged", "dense")}
        for step in steps.values():  # warm-up (and the pool's first allocation)
            per_step(step, batch)
        runs: dict[str, list[float]] = {kv: [] for kv in steps}
        for _ in range(args.repeats):
            for kv, step in steps.items():
                runs[kv].append(per_step(step, batch))
        paged, dense = (statistics.median(runs[kv]) for kv in ("paged", "dense"))
        row = kv_row_bytes(model, prompt + NEW)
        chosen = "dense" if row < DENSE_BELOW_BYTES else "paged"
        ratio = paged / dense
        right = abs(ratio - 1) <= TIE or (chosen == "dense") == (ratio > 1)
        if not right:
            wrong.append(size)
        print(
            f"kv-choice[{layers}x{width},p{prompt}]: paged/dense {ratio:.2f}x ({paged * 1e3:.1f} against "
            f"{dense * 1e3:.1f} ms a step), {row // 1024} KiB a row -> {chosen}: {'right' if right else 'WRONG'}",
            flush=True,
        )
    print(f"threshold: dense below {DENSE_BELOW_BYTES // 1024} KiB of keys and values a row")
    if wrong:
        print(f"error: the size rule picks the slower cache for {', '.join(wrong)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
