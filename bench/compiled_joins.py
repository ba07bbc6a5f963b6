"""Benchmark: how requests joining a compiled decoder-only search reach its buffers, under open-loop arrivals.

A compiled step (``beamkit.hf.DecoderOnlyStep(model, compile=...)``) keeps keys/values in static buffers. A
request that joins the running :class:`beamkit.Engine` is written into free rows of those buffers where it fits;
otherwise the buffers go out to a dense cache and back (a round trip: 7 ms out and 22 ms back at 64 rows x 64
columns on a 2-core CPU, more at wider buckets). This counts which way each join went, for a seeded workload:
an untrained GPT-2 (2 layers x 64, vocabulary 1000, built from a config, offline), ``--requests`` prompts of 4-11
random tokens arriving as a Poisson process (``--gap`` steps apart on average), beam 4, the pool policy, each
request with its own ``max_len`` of 4-23 tokens, stop token 2, so requests leave while others arrive. It
prints::

    compiled-joins: 200 requests over 357 steps, 56 rows at most; joins in place 148, through a dense cache 2

The backend is torch.compile's ``eager`` by default (graph capture, guards and static shapes without inductor's
C++ build; the buffers' handling is the same); ``--compile inductor`` compiles with inductor.

    python bench/compiled_joins.py [--requests 200] [--gap 1.5] [--compile eager]
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from beamkit import Engine  # noqa: E402
from beamkit.hf import DecoderOnlyStep  # noqa: E402
from beamkit.hf.steps import compiled as hc  # noqa: E402
from beamkit.hf.steps import step as hs  # noqa: E402

VOCAB, BEAM, EOS = 1000, 4, 2


def counting() -> dict[str, int]:
    """Count joins written in place and round trips of the buffers through a dense cache (patches the two)."""
    counts = {"in place": 0, "dense": 0}
    in_place, to_dynamic = hs.join_in_place, hc.StaticLayers.to_dynamic

    def joined(parts: Any) -> Any:
        counts["in place"] += 1
        return in_place(parts)

    def out(self: Any, *args: Any) -> Any:
        counts["dense"] += 1
        return to_dynamic(self, *args)

    hs.join_in_place = joined  # type: ignore[assignment]
    hc.StaticLayers.to_dynamic = out  # type: ignore[method-assign]
    return counts


def main(argv: list[str] | None = None) -> None:
    """Run the workload and print how its joins went."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="requests in the workload")
    parser.add_argument("--gap", type=float, default=1.5, help="mean steps between arrivals")
    parser.add_argument("--compile", default="eager", help="the torch.compile backend of the step")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.gap <= 0:
        parser.error("--requests must be >= 1 and --gap > 0")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        vocab_size=VOCAB,
        n_positions=256,
        bos_token_id=1,
        eos_token_id=EOS,
        pad_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    counts = counting()
    step = DecoderOnlyStep(model, compile=args.compile)
    engine = Engine(step, beam_size=BEAM, max_len=24, policy="pool")
    rng = np.random.default_rng(0)
    arrive = np.cumsum(rng.exponential(args.gap, size=args.requests)).astype(int)
    t = added = done = 0
    with torch.inference_mode():
        while done < args.requests:
            while added < args.requests and arrive[added] <= t:
                ids = torch.from_numpy(rng.integers(3, VOCAB, size=(1, int(rng.integers(4, 12)))))
                state = step.init_state(ids, torch.ones_like(ids))
                engine.add(state, 0, [EOS], num_return=1, max_len=int(rng.integers(4, 24)))
                added += 1
            for completed in engine.step():
                if completed.error is not None:
                    sys.exit(f"compiled-joins: a request failed: {completed.error}")
                done += 1
            t += 1
    print(
        f"compiled-joins: {args.requests} requests over {t} steps, {max(step.stats.rows_per_call)} rows at most; "
        f"joins in place {counts['in place']}, through a dense cache {counts['dense']}"
    )


if __name__ == "__main__":
    main()
