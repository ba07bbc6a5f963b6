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
COMMAND_MODULES: tuple[str, ...] = (
    "beamkit.tasks.cli",
    "beamkit.ctc.cli",
    "beamkit.corpus.cli",
    "beamkit.demo",
    "beamkit.explain",
    "beamkit.serve.cli",
)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows ``(default: X)`` after an option's help, unless the default is None or False or the help already
    says what the default is."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text:
            return text
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with every feature's subcommands registered."""
    parser = argparse.ArgumentParser(
        prog="beamkit", description="Beam-search decoding for any sequence model.", formatter_class=HelpFormatter
    )
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
