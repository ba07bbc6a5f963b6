"""Paged KV cache vs the dense gather cache: peak KV bytes and time per step, in one run.

An untrained Transformer (6 + 6 layers, 512 wide, 8 heads, feed-forward 2048, target vocabulary 1000), one torch
thread. Each request has a 32-token source and a forced decoder prefix of ``prompt`` tokens, fed teacher-forced
into the cache once by ``init_state(prefix=...)`` (for an encoder-decoder the "prompt" is the decoder prefix;
every beam of the request shares it), then beam search for ``new`` tokens without a stop token, so every
hypothesis runs the full length. The dense run keeps per-row ``[rows, heads, t, d]`` tensors (gathered by parent
at every step); the paged run keeps a :class:`beamkit.kv.PagedKVCache`.

KV bytes are read by the engine after each model call (``engine.stats.kv_peak_bytes``: the dense tensors the
state holds, or the pool's blocks in use); the paged pool's own peak is checked to equal it. Transient copies
inside a step (the dense ``cat`` and gather) are not counted, which favours the dense cache. Time per step is
the decode loop (``engine.step()`` calls) divided by the steps, best of ``--repeats`` runs, the two caches
interleaved, after one warm-up run of each; the pool is allocated once per setting; the prefix prefill, the same
for both, is not timed. ``kv-step-time`` is the process CPU time (one
torch thread: the machines here are shared, and wall time mostly measures the neighbours); ``kv-step-wall``,
the wall-clock ratio, is printed too. Recomputed tokens: positions the paged cache
wrote minus (prefix + one per row per call). Prints, per setting::

    kv-memory[beam8,prompt256]: 0.35x dense
    kv-step-time[beam8,prompt256]: 0.90x dense

    python bench/paged_kv.py [--repeats 3] [--block-size 16] [--new 64]
"""

from __future__ import annotations

import argparse
import time

import torch

from beamkit import Engine
from beamkit.kv import PagedKVCache
from beamkit.models.transformer import Transformer
from beamkit.models.vocab import SPECIALS, Vocab


def build_model() -> Transformer:
    torch.manual_seed(0)
    src = Vocab(SPECIALS + tuple(f"s{i}" for i in range(61)))
    tgt = Vocab(SPECIALS + tuple(f"t{i}" for i in range(997)))
    model = Transformer(src, tgt, d_model=512, heads=8, ff=2048, enc_layers=6, dec_layers=6, max_len=400)
    return model.eval()


def make_cache(model: Transformer, beam: int, prompt: int, new: int, block_size: int) -> PagedKVCache:
    """A pool with room for ``beam`` rows of ``prompt + new`` positions (allocated once per setting, as a server
    would, and reused by every run: a fresh 64 MiB pool per run costs page faults that are no part of a step)."""
    per_row = -(-(prompt + new) // block_size) + 1
    return model.paged_cache(per_row * beam + 4, block_size)


def decode(model: Transformer, beam: int, prompt: int, new: int, cache: PagedKVCache | None) -> dict:
    """One request decoded with the dense cache (``cache`` None) or the paged one; returns the figures."""
    g = torch.Generator().manual_seed(prompt)
    src = torch.randint(3, len(model.src_vocab), (1, 32), generator=g)
    prefix = torch.randint(3, len(model.tgt_vocab), (1, prompt + 1), generator=g)
    if cache is not None:
        cache.reset_peak()
        written, copied = cache.written_positions, cache.copied_blocks
    with torch.inference_mode():
        state = model.init_state(src, None, prefix[:, :prompt], kv=cache)
        engine = Engine(model.step, beam_size=beam, max_len=new)
        engine.add(state, int(prefix[0, prompt]), None)
        del state
        start, cpu = time.perf_counter(), time.process_time()
        done = []
        while not engine.idle:
            done += engine.step()
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    stats = engine.stats
    out = {
        "step_s": cpu / stats.model_calls,
        "wall_s": elapsed / stats.model_calls,
        "kv_peak": stats.kv_peak_bytes,
        "tokens": [h.tokens for h in done[0].hypotheses],
    }
    if cache is not None:
        assert cache.peak_bytes() == stats.kv_peak_bytes
        out["recomputed"] = cache.written_positions - written - (prompt + stats.rows_total)
        out["copied"] = cache.copied_blocks - copied
        out["pool"] = cache.n_blocks * cache.block_bytes
        del engine, done
        assert cache.blocks_in_use() == 0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--new", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = build_model()
    for beam in (4, 8):
        for prompt in (64, 256):
            runs: dict[str, list[dict]] = {"dense": [], "paged": []}
            cache = make_cache(model, beam, prompt, args.new, args.block_size)
            decode(model, beam, prompt, args.new, None)  # warm-up, not counted
            decode(model, beam, prompt, args.new, cache)
            for _ in range(args.repeats):
                runs["dense"].append(decode(model, beam, prompt, args.new, None))
                runs["paged"].append(decode(model, beam, prompt, args.new, cache))
            d, p = runs["dense"][-1], runs["paged"][-1]
            cpu = {k: min(r["step_s"] for r in v) for k, v in runs.items()}
            wall = {k: min(r["wall_s"] for r in v) for k, v in runs.items()}
            tag = f"beam{beam},prompt{prompt}"
            same = all(r["tokens"] == runs["dense"][0]["tokens"] for v in runs.values() for r in v)
            print(
                f"[{tag}] dense: peak KV {d['kv_peak'] / 2**20:.1f} MiB, {cpu['dense'] * 1e3:.1f} ms/step CPU "
                f"({wall['dense'] * 1e3:.1f} wall); paged (block {args.block_size}): peak KV "
                f"{p['kv_peak'] / 2**20:.1f} MiB (pool preallocated {p['pool'] / 2**20:.1f} MiB), "
                f"{cpu['paged'] * 1e3:.1f} ms/step CPU ({wall['paged'] * 1e3:.1f} wall), {p['copied']} blocks "
                f"copied on write, recomputed tokens {p['recomputed']}; hypotheses {'identical' if same else 'DIFFER'}"
            )
            print(f"kv-memory[{tag}]: {p['kv_peak'] / d['kv_peak']:.2f}x dense")
            print(f"kv-step-time[{tag}]: {cpu['paged'] / cpu['dense']:.2f}x dense")
            print(f"kv-step-wall[{tag}]: {wall['paged'] / wall['dense']:.2f}x dense")


if __name__ == "__main__":
    main()
