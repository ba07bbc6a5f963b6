"""``beamkit demo``: the worked example of the exact beam-search contract, beam against greedy, as a small table."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from beamkit.cli.args import add_command
from beamkit.decode import beam_search, greedy_decode
from beamkit.demo import EOS, NAMES, table_step


def run(args: argparse.Namespace) -> int:
    """Print beam (K=2) against greedy on the worked example, with L=2 and no length penalty."""
    init = np.empty(1, dtype=object)
    init[0] = ()
    rows = [("greedy", greedy_decode(table_step, init, -1, EOS, max_len=2))]
    rows += [(f"beam 2 #{i + 1}", h) for i, h in enumerate(beam_search(table_step, init, -1, EOS, 2, 2, 0.0))]
    print(f"{'search':<12} {'output':<8} {'P':>6} {'logprob':>9}  finished")
    for name, h in rows:
        out = " ".join(NAMES[t] for t in h.tokens)
        print(f"{name:<12} {out:<8} {np.exp(h.logprob):>6.3f} {h.logprob:>9.4f}  {h.finished}")
    return 0


def register(subparsers: Any) -> None:
    """Add the ``demo`` subcommand."""
    add_command(
        subparsers,
        "demo",
        "a worked example: beam search beats greedy",
        "Greedy decoding commits to 'a' and ends with 'a b' (P = 0.35); a beam of two finds 'b eos' (P = 0.36). "
        "No options.",
        run=run,
    )
