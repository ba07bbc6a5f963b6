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

from beamkit.cli.args import add_command, add_model_arg, add_render_args, add_search_args, check_output
from beamkit.explain import FORMATS, MAX_BEAM, explain, render


def run(args: argparse.Namespace) -> int:
    """``beamkit explain``: trace one search, write the drawing to ``-o`` (or stdout)."""
    if args.output is not None:
        check_output(args.output, "-o", args.force)
    try:
        trace = explain(args.model, args.text, args.beam, args.length_penalty, args.max_len, args.policy)
    except ImportError as exc:
        print(f"beamkit explain: error: {exc}", file=sys.stderr)
        return 2
    page = render(trace, args.format)
    if args.output is None:
        sys.stdout.write(page)
        return 0
    Path(args.output).write_text(page, encoding="utf-8")
    best = "-" if trace.best_text is None else repr(trace.best_text)
    print(f"wrote {args.output}: {len(trace.nodes)} nodes over {len(trace.steps)} steps; best: {best}")
    return 0


def register(subparsers: Any) -> None:
    """Add the ``explain`` subcommand."""
    p = add_command(
        subparsers,
        "explain",
        "draw the search tree of one decode (HTML, SVG, DOT or JSON)",
        "Every candidate considered, which ran on, which were pruned, which finished, and the greedy path (HTML "
        "opens offline in a browser).",
        run=run,
    )
    p.add_argument("text", help="the input, e.g. '3rd of March 1999'")
    add_model_arg(p)
    add_search_args(  # no --n-best: one tree is drawn
        p,
        beam_help=f"beam width (at most {MAX_BEAM}: the drawing of a wider beam is too large to read)",
        with_n_best=False,
        max_len_help="most output tokens (default: the model's; hf:DIR: 20)",
    )
    p.add_argument(
        "--policy",
        choices=["narrow", "pool", "compete"],
        default=None,
        help="search policy (beamkit checkpoints; default: narrow; a Hugging Face model decodes with pool)",
    )
    add_render_args(p, FORMATS)
