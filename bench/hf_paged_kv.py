"""Paged keys/values for a Hugging Face model against the dense bridge: KV bytes and time per step, in one run.

An untrained GPT-2 built from a config (6 layers, 512 wide, 8 heads, vocabulary 8192, ``torch.manual_seed(0)``,
offline), one torch thread, float32, SDPA attention. Requests go through :class:`beamkit.Engine` with
:class:`beamkit.hf.DecoderOnlyStep` (``kv="paged"`` or ``kv="dense"``), beam 8, no stop token, so every
hypothesis runs ``--new`` tokens; ``--attention`` is how the paged steps attend (``shared-prefix``, the default,
or ``gather``: every row's keys/values gathered into the dense layout by the cache's gather index). Two settings:
one request with a 256-token prompt, and a batch of four requests (prompts of 256, 240, 200 and 256 tokens,
joined left-padded into one prompt forward).

KV bytes: the paged pool's peak blocks in use times the block's bytes (``PagedKVCache.peak_bytes``; the pool's
capacity is printed too), against the dense bridge's peak of the ``DynamicLayer`` keys/values it holds after a
step. Transient tensors inside a step are left out of both figures and printed apart: the paged cache's
gather of one layer (its shared-prefix attention gathers each row's own tail, ``[heads, rows, tail, d]`` keys
and values, freed after the layer's attention; the prompt blocks every beam shares are read in place) and the
dense cache's ``cat`` of one layer (the grown copy made while the old one is alive). Time per step: the
engine steps after the prompt forward, divided by the steps, per run; the median over ``--repeats`` runs of
each cache, interleaved, after one warm-up run of each (each cache keeps its step function, so the pool is
allocated once, as a server does). ``[step]`` is the ratio of process CPU times (one torch thread: on a shared
machine wall time mostly measures the neighbours); the wall-clock ratio is printed too. The tokens of the
two caches are checked identical. Prints::

    hf-paged-kv[memory]: 0.29x
    hf-paged-kv[step]: 0.85x

    python bench/hf_paged_kv.py [--repeats 5] [--new 64] [--block-size 16] [--attention shared-prefix|gather]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
import transformers

from beamkit import Engine
from beamkit.hf import DecoderOnlyStep
from beamkit.hf.steps.paged import PAGED_ATTENTION, PagedCache
from beamkit.kv.attention import plan_prefix

BEAM = 8
VOCAB = 8192
SETTINGS = {"prompt256": [256], "batch4": [256, 240, 200, 256]}


def build_model() -> Any:
    """The untrained GPT-2 of the benchmark (seeded, from a config)."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=6, n_embd=512, n_head=8, vocab_size=VOCAB, n_positions=1024, bos_token_id=1, eos_token_id=2,
        pad_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(cfg).eval()


def prompts(lengths: list[int]) -> list[torch.Tensor]:
    """One ``[1, P]`` prompt of random tokens per length (seeded)."""
    g = torch.Generator().manual_seed(sum(lengths))
    return [torch.randint(3, VOCAB, (1, n), generator=g) for n in lengths]


class Measured:
    """A step function wrapper that records the keys/values held after each call and one layer's transient."""

    def __init__(self, step: DecoderOnlyStep):
        self.step = step
        self.held = 0  # peak bytes of keys/values held by the state after a call
        self.transient = 0  # peak bytes of one layer's transient tensors inside a call

    def __call__(self, state: Any, y_prev: Any) -> Any:
        logits, new = self.step(state, y_prev)
        cache = getattr(new, "cache", None)
        if isinstance(cache, PagedCache):
            kv = cache.pool.kv
            assert kv is not None
            rows, width = len(cache.rows), cache.length
            if cache.pool.attention == "shared-prefix":  # each row's own tail, as the next step plans it
                width = plan_prefix(cache.rows.table, cache.rows.length + 1, kv.block_size, "cpu").tail
            one_layer = 2 * rows * kv.heads * width * kv.d_head * kv.k[0].element_size()
            self.transient = max(self.transient, one_layer)  # the gather of one layer (keys and values)
        elif cache is not None:
            layers = cache.layers
            held = sum(x.numel() * x.element_size() for layer in layers for x in (layer.keys, layer.values))
            self.held = max(self.held, held)
            self.transient = max(self.transient, held // len(layers))  # the cat's new copy of one layer
        return logits, new


def decode(step: DecoderOnlyStep, batch: list[torch.Tensor], new: int) -> dict[str, Any]:
    """The requests decoded together by one engine; returns the figures of the run."""
    measured = Measured(step)
    if step.pool is not None and step.pool.kv is not None:
        step.pool.kv.reset_peak()
    engine = Engine(measured, beam_size=BEAM, max_len=new, policy="pool")
    done = []
    with torch.inference_mode():
        for ids in batch:
            engine.add(step.init_state(ids, torch.ones_like(ids)), 0, None)
        done += engine.step()  # the prompt forward (one for all requests), not timed
        start, cpu, calls = time.perf_counter(), time.process_time(), 0
        while not engine.idle:
            done += engine.step()
            calls += 1
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    pool = step.pool.kv if step.pool is not None else None
    held = pool.peak_bytes() if pool is not None else measured.held
    if pool is not None:
        assert pool.blocks_in_use() == 0, "finished requests left blocks in the pool"
    return {
        "cpu": cpu / calls,
        "wall": wall / calls,
        "held": held,
        "transient": measured.transient,
        "capacity": 0 if pool is None else pool.n_blocks * pool.block_bytes,
        "copied": 0 if pool is None else pool.copied_blocks,
        "tokens": sorted((c.request_id, [h.tokens for h in c.hypotheses]) for c in done),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--attention", choices=PAGED_ATTENTION, default="shared-prefix")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = build_model()
    mib = 2**20
    for tag, lengths in SETTINGS.items():
        batch = prompts(lengths)
        steps = {
            kv: DecoderOnlyStep(model, kv, block_size=args.block_size, attention=args.attention)
            for kv in ("paged", "dense")
        }
        runs: dict[str, list[dict[str, Any]]] = {"paged": [], "dense": []}
        for step in steps.values():  # warm-up (and the pool's first allocation)
            decode(step, batch, args.new)
        for _ in range(args.repeats):
            for kv, step in steps.items():
                runs[kv].append(decode(step, batch, args.new))
        p, d = runs["paged"], runs["dense"]
        if any(r["tokens"] != d[0]["tokens"] for r in p + d):
            raise SystemExit(f"{tag}: the paged and dense caches decoded different tokens")
        cpu = {kv: statistics.median(r["cpu"] for r in runs[kv]) for kv in runs}
        wall = {kv: statistics.median(r["wall"] for r in runs[kv]) for kv in runs}
        memory = p[0]["held"] / d[0]["held"]
        with_transient = (p[0]["held"] + p[0]["transient"]) / (d[0]["held"] + d[0]["transient"])
        print(
            f"{tag} (beam {BEAM}, prompts {lengths}, {args.new} new tokens, block {args.block_size}, "
            f"{args.attention} attention): "
            f"KV held paged {p[0]['held'] / mib:.1f} MiB (pool capacity {p[0]['capacity'] / mib:.1f} MiB, "
            f"{p[0]['copied']} blocks copied on write in all runs) vs dense {d[0]['held'] / mib:.1f} MiB; "
            f"transient one layer: paged gather {p[0]['transient'] / mib:.1f} MiB, dense cat "
            f"{d[0]['transient'] / mib:.1f} MiB; with them {with_transient:.2f}x; "
            f"step CPU {cpu['paged'] * 1e3:.1f} vs {cpu['dense'] * 1e3:.1f} ms, wall {wall['paged'] * 1e3:.1f} vs "
            f"{wall['dense'] * 1e3:.1f} ms (median of {args.repeats}); tokens identical"
        )
        suffix = "" if tag == "prompt256" else f",{tag}"
        print(f"hf-paged-kv[memory{suffix}]: {memory:.2f}x")
        print(f"hf-paged-kv[step{suffix}]: {cpu['paged'] / cpu['dense']:.2f}x")
        print(f"hf-paged-kv[step-wall{suffix}]: {wall['paged'] / wall['dense']:.2f}x")


if __name__ == "__main__":
    main()
