"""Search overhead: the engine alone against one memory pass over the same logits.

64 requests x beam 5 x V = 32000 float32. The step function returns precomputed logits (no model), so the time
per step is the search itself: log-normalisation, per-row top-2k, ranking, pools, state gather. The peer is one
pass over the same ``[rows, V]`` array (``logits.max(axis=1)``), measured in the same run. Prints, per backend,
``search-overhead[numpy]: 2.31x`` (median over repeats).

    python bench/search_overhead.py [--repeats 7] [--steps 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from beamkit import BeamSearch, SearchOptions

REQUESTS, BEAM, VOCAB = 64, 5, 32000


def make_logits(backend: str, rows: int, steps: int):
    rng = np.random.default_rng(0)
    # shape: (steps, rows, V); eos (the last id) unlikely so every request stays live for all steps
    x = rng.standard_normal((steps, rows, VOCAB), dtype=np.float32) * 3.0
    x[:, :, VOCAB - 1] = -30.0
    if backend == "torch":
        import torch

        return [torch.from_numpy(a) for a in x]
    return list(x)


def time_search(backend: str, policy: str, steps: int, logits) -> float:
    """Seconds per step of a full search whose model is a lookup."""
    it = iter(range(steps))

    def step(state, y_prev):
        t = next(it)
        return logits[t][: state.shape[0]], state

    init = np.zeros((REQUESTS, 1), dtype=np.float32)
    if backend == "torch":
        import torch

        init = torch.zeros(REQUESTS, 1)
    opts = SearchOptions(BEAM, steps, policy=policy, early_stopping="never")
    t0 = time.perf_counter()
    BeamSearch(opts).search(step, init, 0, VOCAB - 1)
    return (time.perf_counter() - t0) / steps


def time_pass(logits) -> float:
    """Seconds for one memory pass (row max) over one step's logits."""
    t0 = time.perf_counter()
    for a in logits:
        a.max(axis=1) if isinstance(a, np.ndarray) else a.max(dim=1)
    return (time.perf_counter() - t0) / len(logits)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--policy", default="pool", choices=["pool", "narrow"])
    args = ap.parse_args()
    backends = ["numpy"]
    try:
        import torch

        torch.set_num_threads(max(1, torch.get_num_threads()))
        backends.append("torch")
    except ImportError:
        pass
    for backend in backends:
        logits = make_logits(backend, REQUESTS * BEAM, args.steps)
        ratios, per_step, per_pass = [], [], []
        for _ in range(args.repeats):
            s = time_search(backend, args.policy, args.steps, logits)
            p = time_pass(logits)
            ratios.append(s / p)
            per_step.append(s)
            per_pass.append(p)
        print(
            f"# {backend}: search {statistics.median(per_step) * 1e3:.2f} ms/step, "
            f"one pass {statistics.median(per_pass) * 1e3:.2f} ms ({REQUESTS}x{BEAM} rows, V={VOCAB}, {args.policy})"
        )
        print(f"search-overhead[{backend}]: {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
