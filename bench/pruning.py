"""Score-threshold pruning (``beam_threshold``) and shallow fusion on real models: the dates model and g2p-en.

For beam widths 5, 10, 20, 50, each task is decoded without and with a threshold T (a candidate more than T
below its request's best candidate at that step is dropped), and optionally with an n-gram LM fused in.
Reported per width: accuracy, rows per model call, total rows, time per request; the pruned run against the
plain one in the same process::

    pruning[g2p,beam20]: 0.45x rows, accuracy -0.10 pt

Inputs: the first ``--n`` examples of the dates test split and of the g2p test split (the words held out of
``beamkit corpus g2p``). Run from the repository root::

    beamkit corpus g2p -o phones.txt && beamkit lm build phones.txt --order 5 -o phones.arpa
    beamkit corpus dates -o dates.txt && beamkit lm build dates.txt --order 6 -o dates.arpa
    PYTHONPATH=src python bench/pruning.py --g2p-lm phones.arpa --g2p-lm-weight 0.1 \\
        --dates-lm dates.arpa --dates-lm-weight 0.3 --plot docs/fusion_pruning.png
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from beamkit import BeamSearch, NGramLM, fuse
from beamkit.search import make_options

BEAMS = (5, 10, 20, 50)


def g2p_task(n: int) -> tuple[Any, list[tuple[Any, Callable[[list[int]], bool]]], dict[str, Any]]:
    """The g2p-en model and the first ``n`` test words, each with a correctness check of the output ids."""
    from beamkit.models.g2p import BOS, EOS, MAX_LEN, PHONEMES, G2PModel, phonemes
    from beamkit.tasks import g2p

    model = G2PModel.load()
    sample = g2p.word_split("test")[:n]
    words = [w for w, _ in sample]
    checks = [lambda toks, p=prons: tuple(phonemes(toks)) in p for _, prons in sample]
    info = {"step": model.step, "init": lambda: model.init_state(words), "bos": BOS, "eos": EOS, "max_len": MAX_LEN}
    return model, list(zip(words, checks, strict=True)), info | {"vocab": list(PHONEMES)}


def dates_task(n: int) -> tuple[Any, list[tuple[Any, Callable[[list[int]], bool]]], dict[str, Any]]:
    """The shipped dates-seq2seq model and the first ``n`` test pairs."""
    import torch

    from beamkit.models import load_model
    from beamkit.models.common import encode_sources, pad_batch
    from beamkit.tasks import dates

    model = load_model("dates-seq2seq")
    pairs = dates.split("test", limit=n)
    tv = model.tgt_vocab
    src, lengths = pad_batch(encode_sources(model.src_vocab, [s for s, _ in pairs]), model.src_vocab.pad)

    def init() -> Any:
        return model.init_state(torch.as_tensor(src), torch.as_tensor(lengths))

    checks = [lambda toks, t=tgt: tv.decode(toks) == t for _, tgt in pairs]
    max_len = int(model.meta.get("max_len", 12))
    info = {"step": model.step, "init": init, "bos": tv.bos, "eos": tv.eos, "max_len": max_len}
    return model, list(zip([s for s, _ in pairs], checks, strict=True)), info | {"vocab": dates.lm_vocab()}


def run(info: dict[str, Any], items: list, beam: int, threshold: float | None, lm: Any, weight: float) -> dict:
    """One decode of every item: accuracy, rows per call, total rows, seconds per request."""
    step, state = info["step"], info["init"]()
    if lm is not None:
        step = fuse(info["step"], lm, weight)
        state = step.init_state(state, lm.init_state(len(items)))
    extra = {} if threshold is None else {"beam_threshold": threshold}
    opts = make_options(beam, info["max_len"], length_penalty=1.0, **extra)
    t0 = time.perf_counter()
    result = BeamSearch(opts).search(step, state, info["bos"], info["eos"])
    seconds = time.perf_counter() - t0
    correct = [check(h[0].tokens) for h, (_, check) in zip(result.hypotheses, items, strict=True)]
    rows = result.stats.rows_per_call
    return {
        "accuracy": float(np.mean(correct)),
        "rows_total": int(sum(rows)),
        "rows_per_call": float(np.mean(rows)),
        "ms_per_request": 1000 * seconds / len(items),
    }


def bench_task(name: str, task: Callable, args: argparse.Namespace, lm_path: str | None, weight: float) -> dict:
    """Every beam width without and with the threshold, then the same with the LM fused in (if given)."""
    import torch

    torch.set_num_threads(1)
    _, items, info = task(args.n)
    lm = NGramLM(lm_path, info["vocab"]) if lm_path else None
    out: dict[str, Any] = {}
    for label, use_lm in (("plain", None), ("fused", lm)):
        if label == "fused" and lm is None:
            continue
        run(info, items, BEAMS[-1], None, use_lm, weight)  # warm-up, untimed: fills the n-gram LM's context cache
        for beam in BEAMS:
            base = run(info, items, beam, None, use_lm, weight)
            pruned = run(info, items, beam, args.threshold, use_lm, weight)
            out[f"{label},beam{beam}"] = {"base": base, "pruned": pruned}
            ratio = pruned["rows_total"] / base["rows_total"]
            delta = 100 * (pruned["accuracy"] - base["accuracy"])
            tag = name if label == "plain" else f"{name}+lm"
            print(
                f"pruning[{tag},beam{beam}]: {ratio:.2f}x rows, accuracy {delta:+.2f} pt  "
                f"(accuracy {base['accuracy']:.4f} -> {pruned['accuracy']:.4f}; rows/call "
                f"{base['rows_per_call']:.0f} -> {pruned['rows_per_call']:.0f}; ms/request "
                f"{base['ms_per_request']:.2f} -> {pruned['ms_per_request']:.2f})",
                flush=True,
            )
    return out


def plot(runs: list[tuple[float, dict[str, dict]]], path: str) -> None:
    """Accuracy (top) and rows per model call (bottom) against beam width, per task: the model alone and with
    the LM fused in, each without a threshold and with each run's threshold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(t for _, res in runs for t in res))
    fig, axes = plt.subplots(2, len(tasks), figsize=(5 * len(tasks), 6.4), dpi=120, squeeze=False)
    styles = ["--", ":", "-."]
    for col, task in enumerate(tasks):
        for row, metric in enumerate(("accuracy", "rows_per_call")):
            ax = axes[row][col]
            for label, marker in (("plain", "o"), ("fused", "s")):
                name = "LM fused" if label == "fused" else "model"
                drawn = False
                for i, (threshold, results) in enumerate(runs):
                    res = results.get(task, {})
                    if f"{label},beam{BEAMS[0]}" not in res:
                        continue
                    if not drawn:
                        values = [res[f"{label},beam{b}"]["base"][metric] for b in BEAMS]
                        ax.plot(BEAMS, values, marker=marker, linestyle="-", label=name)
                        drawn = True
                    values = [res[f"{label},beam{b}"]["pruned"][metric] for b in BEAMS]
                    style = styles[i % len(styles)]
                    ax.plot(BEAMS, values, marker=marker, linestyle=style, label=f"{name}, T={threshold:g}")
            ax.set_xscale("log")
            if metric == "rows_per_call":
                ax.set_yscale("log")
            ax.minorticks_off()
            ax.set_xticks(BEAMS)
            ax.set_xticklabels([str(b) for b in BEAMS])
            ax.set_xlabel("beam width")
            ax.set_ylabel("accuracy" if metric == "accuracy" else "rows per model call")
            ax.set_title(f"{task}: {'accuracy' if metric == 'accuracy' else 'rows per call'}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    """Parse the options, run both tasks, print the ratios; optionally write JSON and the plot."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=300, help="examples per task (default 300)")
    p.add_argument("--threshold", type=float, default=3.0, help="beam_threshold T (default 3.0)")
    p.add_argument("--tasks", default="g2p,dates", help="comma-separated: g2p, dates")
    p.add_argument("--g2p-lm", default=None, help="phoneme ARPA to fuse (beamkit corpus g2p + lm build)")
    p.add_argument("--g2p-lm-weight", type=float, default=0.1)
    p.add_argument("--dates-lm", default=None, help="target-side ARPA for the dates model")
    p.add_argument("--dates-lm-weight", type=float, default=0.3)
    p.add_argument("--json", default=None, help="write every figure to this JSON file")
    p.add_argument("--plot", default=None, help="write accuracy against beam width to this PNG")
    p.add_argument("--plot-from", nargs="+", default=None, metavar="JSON", help="only plot earlier --json outputs")
    args = p.parse_args()
    if args.plot_from:
        saved = [json.load(open(f, encoding="utf-8")) for f in args.plot_from]
        plot([(s["threshold"], s["results"]) for s in saved], args.plot or "docs/fusion_pruning.png")
        return
    tasks = {
        "g2p": (g2p_task, args.g2p_lm, args.g2p_lm_weight),
        "dates": (dates_task, args.dates_lm, args.dates_lm_weight),
    }
    results = {}
    for name in args.tasks.split(","):
        task, lm_path, weight = tasks[name]
        results[name] = bench_task(name, task, args, lm_path, weight)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"threshold": args.threshold, "n": args.n, "results": results}, fh, indent=1)
    if args.plot:
        plot([(args.threshold, results)], args.plot)
        print(f"plot written to {args.plot}")


if __name__ == "__main__":
    main()
