"""Corpus decoding: 1 worker against 2, on the local back-end and on Ray, and Ray's cost per input over local.

2,000 inputs (the dates test split on the shipped ``dates-seq2seq`` model; 2,000 ``cmudict`` words on the g2p-en
GRU), beam 5, batches of 32, one thread per worker. Each configuration decodes the whole corpus into a fresh
output (``beamkit.corpus.decode_corpus``). Times are measured two ways:

* end to end: from the call to the assembled file, including each worker's start-up (process or actor start,
  imports, model load), which a corpus pays once per worker whatever its size;
* steady: the time per input once the workers are up, what a large corpus sees: from the moment 20% of the
  inputs have come back to the moment 90% have, over the 70% of the inputs in between (batches are timed as
  they reach the driver; the start-up and the last batches' imbalance are left out).

Prints ``corpus-scaling[local,2]: X.XXx`` and ``corpus-scaling[ray,2]: X.XXx`` (steady rate of 2 workers over
1, target >= 1.6x on a 2-core machine), the end-to-end ratios, and ``ray-overhead[W]: +X.XX ms/input`` (Ray's
steady time per input minus local's, W workers). Ray runs on a local instance (``ray.init(num_cpus=2)``),
started before the timings.

    python bench/corpus_scaling.py [--inputs 2000] [--models dates-seq2seq,g2p-en] [--repeats 1]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # the in-process worker too: one thread per worker
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from beamkit.corpus import DecodeOptions, decode_corpus  # noqa: E402


def corpus(model: str, n: int) -> list[str]:
    """``n`` inputs for ``model``: dates test sources or cmudict words (fixed, the same every run)."""
    if model == "g2p-en":
        from beamkit.tasks.g2p import sample_words

        return [w for w, _ in sample_words(n)]
    from beamkit.tasks.dates import split

    sources = [s for s, _ in split("test")]
    return (sources * (n // len(sources) + 1))[:n]


def timed_run(src: Path, folder: Path, model: str, workers: int, ray: str | None) -> tuple[float, float]:
    """(end-to-end seconds, steady seconds per input) of one full decode of ``src`` into a fresh output."""
    arrived: list[tuple[int, float]] = []
    count = 0

    def on_batch(n: int) -> None:
        nonlocal count
        count += n
        arrived.append((count, time.perf_counter()))

    began = time.perf_counter()
    out = folder / f"{model}-{'ray' if ray is not None else 'local'}-{workers}-{time.monotonic_ns()}.jsonl"
    options = DecodeOptions(model=model, beam=5)
    decode_corpus(src, out, options, workers=workers, ray=ray, batch_size=32, shard_size=500, on_batch=on_batch)
    total = time.perf_counter() - began
    lo = next((c, t) for c, t in arrived if c >= 0.2 * count)
    hi = next((c, t) for c, t in arrived if c >= 0.9 * count)
    return total, (hi[1] - lo[1]) / (hi[0] - lo[0])


def main() -> None:
    """Time every configuration and print the ratios."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", type=int, default=2000)
    ap.add_argument("--models", default="dates-seq2seq,g2p-en")
    ap.add_argument("--repeats", type=int, default=1, help="runs per configuration; the best is kept")
    args = ap.parse_args()

    import logging

    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            for model in args.models.split(","):
                src = folder / f"{model}.txt"
                src.write_text("\n".join(corpus(model, args.inputs)) + "\n")
                res: dict[tuple[str, int], tuple[float, float]] = {}
                for backend in ("local", "ray"):
                    for workers in (1, 2):
                        on = "" if backend == "ray" else None
                        runs = [timed_run(src, folder, model, workers, on) for _ in range(args.repeats)]
                        res[backend, workers] = (min(r[0] for r in runs), min(r[1] for r in runs))
                        total, per = res[backend, workers]
                        print(
                            f"  {model} {backend} {workers} worker(s): {total:.2f} s end to end, "
                            f"{per * 1e3:.3f} ms/input steady ({1 / per:.0f} inputs/s)"
                        )
                for backend in ("local", "ray"):
                    steady = res[backend, 1][1] / res[backend, 2][1]
                    e2e = res[backend, 1][0] / res[backend, 2][0]
                    print(f"corpus-scaling[{backend},2]: {steady:.2f}x  ({model}; end to end {e2e:.2f}x)")
                for workers in (1, 2):
                    extra = (res["ray", workers][1] - res["local", workers][1]) * 1e3
                    e2e = (res["ray", workers][0] - res["local", workers][0]) / args.inputs * 1e3
                    print(f"ray-overhead[{workers}]: {extra:+.3f} ms/input  ({model}; end to end {e2e:+.3f} ms/input)")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
