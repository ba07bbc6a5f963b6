"""The ``beamkit`` command line.

Each feature area registers its own subcommands: a module with ``register(subparsers)`` that adds argparse
sub-parsers, each setting ``func`` (called with the parsed namespace, returning an exit code). This file only
collects them, so a feature's command lives next to the feature.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Modules that contribute subcommands; each exposes ``register(subparsers) -> None``.
COMMAND_MODULES: tuple[str, ...] = ("beamkit.tasks.cli", "beamkit.ctc.cli", "beamkit.demo", "beamkit.explain")


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with every feature's subcommands registered."""
    parser = argparse.ArgumentParser(prog="beamkit", description="Beam-search decoding for any sequence model.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``beamkit`` command line; return the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"beamkit {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
