"""Tracing off costs nothing: a search sized so that Python overhead dominates, to count instructions.

16 requests x beam 5 x V=500 float32 logits (precomputed, no model), pool policy, every request live for all
steps. Run under callgrind for N and M steps and compare the difference (the steps without start-up) before and
after a change to the engine; instruction counts do not move with the machine's load, wall time does:

    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null python bench/trace_overhead.py 4
    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null python bench/trace_overhead.py 24

``--trace`` records the trace (the cost of tracing on).
"""

from __future__ import annotations

import argparse

import numpy as np

from beamkit import BeamSearch, SearchOptions

REQUESTS, BEAM, VOCAB = 16, 5, 500


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("steps", type=int)
    ap.add_argument("--trace", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    # shape: (steps, rows, V); eos (the last id) unlikely so every request stays live
    x = rng.standard_normal((args.steps, REQUESTS * BEAM, VOCAB), dtype=np.float32) * 3.0
    x[:, :, VOCAB - 1] = -30.0
    it = iter(range(args.steps))

    def step(state, y_prev):
        return x[next(it)][: state.shape[0]], state

    extra = {"record_trace": True} if args.trace else {}  # without it, an engine from before traces runs it too
    opts = SearchOptions(BEAM, args.steps, policy="pool", early_stopping="never", **extra)
    BeamSearch(opts).search(step, np.zeros((REQUESTS, 1), np.float32), 0, VOCAB - 1)


if __name__ == "__main__":
    main()
