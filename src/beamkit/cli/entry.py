"""The ``beamkit`` command line: the top-level parser and the exit codes.

Each command group is a module of this package with ``register(subparsers)`` that adds argparse sub-parsers, each
setting ``func`` (called with the parsed namespace, returning an exit code). This module only collects them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from beamkit.cli.format import Parser

# Modules that contribute subcommands; each exposes ``register(subparsers) -> None``.
COMMAND_MODULES: tuple[str, ...] = (
    "beamkit.cli.tasks",
    "beamkit.cli.ctc",
    "beamkit.cli.corpus",
    "beamkit.cli.demo",
    "beamkit.cli.explain",
    "beamkit.cli.serve",
)


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with every feature's subcommands registered."""
    from beamkit import __version__

    parser = Parser(prog="beamkit", description="Beam-search decoding for any sequence model.")
    parser.add_argument("--version", action="version", version=f"beamkit {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``beamkit`` command line; return the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:  # no command, or a command group (eval, ctc, lm) without its subcommand
        parser.print_help()
        where = f"beamkit {args.command}" if args.command else "beamkit"
        print(f"{where}: error: a {'subcommand' if args.command else 'COMMAND'} is required", file=sys.stderr)
        return 2
    try:
        return int(func(args) or 0)
    except (ValueError, TypeError, FileNotFoundError) as exc:  # bad input: a usage error
        print(f"beamkit {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except IsADirectoryError as exc:  # a folder where a file belongs: say so, not the system's "Is a directory"
        print(
            f"beamkit {args.command}: error: {exc.filename2 or exc.filename} is a folder, not a file", file=sys.stderr
        )
        return 1
    except OSError as exc:  # no permission, a full disk: the command failed
        print(f"beamkit {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
