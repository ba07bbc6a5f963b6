"""Search overhead: the engine alone against one memory pass over the same logits.

64 requests x beam 5 x V = 32000 float32. The step function returns precomputed logits (no model), so the time
per step is the search itself: log-normalisation, per-row top-2k, ranking, pools, state gather. The peer is one
pass over the same ``[rows, V]`` array (``logits.max(axis=1)``), measured in the same run. Prints, per backend,
``search-overhead[numpy]: 2.31x; target <= 4x: met`` (median over repeats). Targets: numpy <= 4x, torch <= 1.5x
(torch's own ``max`` pass is slower than numpy's, so its ratio is the smaller). One torch thread unless
``--threads`` says otherwise. ``--profile`` prints where a backend's search time goes (its top functions under
cProfile) when it misses its target.

    python bench/search_overhead.py [--repeats 7] [--steps 20] [--threads 1] [--profile]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from beamkit import BeamSearch, SearchOptions

REQUESTS, BEAM, VOCAB = 64, 5, 32000
TARGETS = {"numpy": 4.0, "torch": 1.5}  # search time per step over one pass, at most


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


def profile(backend: str, args: argparse.Namespace, logits) -> None:
    """Where one search's time goes: its top functions by own time under cProfile."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    time_search(backend, args.policy, args.steps, logits)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(10)
    body = out.getvalue().split("ncalls", 1)[-1]
    print(f"  profile of the {backend} search (own time, seconds):\n  ncalls" + body.rstrip().replace("\n", "\n  "))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--policy", default="pool", choices=["pool", "narrow"])
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--profile", action="store_true", help="profile a backend's search when it misses its target")
    args = ap.parse_args()
    backends = ["numpy"]
    try:
        import torch

        torch.set_num_threads(max(1, args.threads))
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
        ratio, goal = statistics.median(ratios), TARGETS[backend]
        print(f"search-overhead[{backend}]: {ratio:.2f}x; target <= {goal:g}x: {'met' if ratio <= goal else 'missed'}")
        if args.profile and ratio > goal:
            profile(backend, args, logits)


if __name__ == "__main__":
    main()
