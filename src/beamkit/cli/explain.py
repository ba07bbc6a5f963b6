"""``beamkit explain``: decode one input with tracing on and draw the search it ran.

beamkit explain "3rd of March 1999" [--model dates-seq2seq] [--beam 5] [--length-penalty 1] -o search.html
beamkit explain "Hello" --model hf:DIR -o search.html          # a Hugging Face model folder with its tokenizer
beamkit explain "3rd of March 1999" --format svg|dot|json -o tree.svg
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from beamkit.explain import FORMATS, explain_dates, explain_hf, render


def run(args: argparse.Namespace) -> int:
    """``beamkit explain``: trace one search, write the drawing to ``-o`` (or stdout)."""
    if args.beam < 1:
        raise ValueError(f"--beam must be >= 1, got {args.beam}")
    if args.max_len is not None and args.max_len < 1:
        raise ValueError(f"--max-len must be >= 1, got {args.max_len}")
    hf = args.model is not None and args.model.startswith("hf:")
    if hf and args.policy is not None:
        raise ValueError("--policy applies to dates models only; leave it out with --model hf:DIR")
    try:
        if hf:
            trace = explain_hf(args.text, args.model[3:], args.beam, args.length_penalty, args.max_len)
        else:
            policy = args.policy or "narrow"
            trace = explain_dates(args.text, args.model, args.beam, args.length_penalty, args.max_len, policy)
    except ImportError as exc:
        print(f"beamkit explain: error: {exc}", file=sys.stderr)
        return 2
    page = render(trace, args.format)
    if args.output is None:
        sys.stdout.write(page)
        return 0
    Path(args.output).write_text(page, encoding="utf-8")
    best = " ".join(trace.text(t) for t in trace.tokens(trace.result[0])) if trace.result else "-"
    print(f"wrote {args.output}: {len(trace.nodes)} nodes over {len(trace.steps)} steps; best: {best}")
    return 0


def register(subparsers: Any) -> None:
    """Add the ``explain`` subcommand."""
    about = "draw the search tree of one decode (HTML, SVG, DOT or JSON)"
    p = subparsers.add_parser(
        "explain",
        help=about,
        description="Draw the search tree of one decode: every candidate considered, which ran on, which were "
        "pruned, which finished, and the greedy path (HTML opens offline in a browser).",
    )
    p.add_argument("text", help="the input, e.g. '3rd of March 1999'")
    p.add_argument(
        "--model", default=None, help="dates model name or checkpoint path (default dates-seq2seq), or hf:DIR"
    )
    p.add_argument("--beam", type=int, default=5, help="beam width")
    p.add_argument("--length-penalty", type=float, default=1.0, help="alpha in logprob / len**alpha")
    p.add_argument("--max-len", type=int, default=None, help="most output tokens (default: the model's; hf: 20)")
    p.add_argument(
        "--policy",
        choices=["narrow", "pool", "compete"],
        default=None,
        help="search policy (dates models only; default: narrow)",
    )
    p.add_argument("--format", choices=FORMATS, default="html", help="output format")
    p.add_argument("-o", "--output", default=None, help="output file (default: stdout)")
    p.set_defaults(func=run)
