"""The ``beamkit`` command line: one parser, one help formatter, shared argument types and option groups, and a
module per command group (``tasks``, ``ctc``, ``corpus``, ``demo``, ``explain``, ``serve``)."""

from beamkit.cli.entry import COMMAND_MODULES, build_parser, main
from beamkit.cli.format import HelpFormatter, Parser

__all__ = ["COMMAND_MODULES", "HelpFormatter", "Parser", "build_parser", "main"]
