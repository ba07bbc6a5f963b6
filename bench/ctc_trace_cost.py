"""What recording a CTC trace costs: one utterance searched with and without a recorder, and the drawing's size.

    python bench/ctc_trace_cost.py [--frames 400] [--labels 32] [--beam 10] [--repeats 5]

Peaky random posteriors (a favourite label per frame, about 60% blank frames). Prints the best-of-N wall times of
the plain search (``Decoder.decode``), the traced search (``Decoder.trace``), JSON / HTML rendering, the entry
count and sizes.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from beamkit.ctc import CTCOptions, Decoder
from beamkit.viz import to_html


def posteriors(frames: int, labels: int, seed: int = 0) -> np.ndarray:
    """Log-probabilities of ``frames`` frames: blank favoured 60% of the time, else a random label."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((frames, labels))
    fav = np.where(rng.random(frames) < 0.6, 0, rng.integers(1, labels, frames))
    x[np.arange(frames), fav] += 6.0
    return x - np.logaddexp.reduce(x, axis=1, keepdims=True)


def best_of(repeats: int, fn: Callable[[], object]) -> float:
    """The shortest of ``repeats`` wall times of ``fn()``, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    """Run the measurement and print it."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=400)
    ap.add_argument("--labels", type=int, default=32)
    ap.add_argument("--beam", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    labels = ["", " "] + [chr(ord("a") + i % 26) + ("" if i < 26 else str(i)) for i in range(args.labels - 2)]
    lp = posteriors(args.frames, args.labels)
    decoder = Decoder(labels, options=CTCOptions(beam_width=args.beam), input_kind="log_probs")
    traces = []

    def plain() -> None:
        decoder.decode(lp)

    def traced() -> None:
        traces[:] = decoder.trace(lp)

    plain()  # compile / warm up
    traced()
    t_plain = best_of(args.repeats, plain)
    t_traced = best_of(args.repeats, traced)
    trace = traces[0]
    t_json = best_of(args.repeats, trace.to_json)
    html = to_html(trace)
    t_html = best_of(args.repeats, lambda: to_html(trace))
    print(f"frames {args.frames}, labels {args.labels}, beam {args.beam}: {trace.n_entries} entries")
    print(f"search  plain {t_plain * 1e3:8.1f} ms   traced {t_traced * 1e3:8.1f} ms   ({t_traced / t_plain:.1f}x)")
    size_json, size_html = len(trace.to_json()) / 1e6, len(html) / 1e6
    print(f"to_json {t_json * 1e3:8.1f} ms ({size_json:.2f} MB)   to_html {t_html * 1e3:8.1f} ms ({size_html:.2f} MB)")


if __name__ == "__main__":
    main()
