"""The one help formatter of every ``beamkit`` command."""

from __future__ import annotations

import argparse
import textwrap
from typing import NoReturn


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows ``(default: X)`` after an option's help, unless the default is None or False or the help already
    says what the default is. Descriptions are filled paragraph by paragraph (blank lines kept); a paragraph whose
    lines are indented (an example) is kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            action.default is None
            or action.default is False
            or action.default == argparse.SUPPRESS
            or "default" in text
        ):
            return text
        return super()._get_help_string(action)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = text.split("\n\n")
        out = []
        for para in paragraphs:
            lines = para.splitlines()
            if lines and all(line.startswith(" ") for line in lines if line.strip()):
                out.append("\n".join(indent + line for line in lines))
            else:
                out.append(
                    textwrap.fill(" ".join(para.split()), width, initial_indent=indent, subsequent_indent=indent)
                )
        return "\n\n".join(out)


class Parser(argparse.ArgumentParser):
    """An argument parser whose help uses :class:`HelpFormatter`; its sub-parsers are Parsers too."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        """A usage error: one line ``beamkit COMMAND: error: MESSAGE`` on standard error, exit code 2 (argparse
        prints its usage lines first; ``--help`` shows them)."""
        self.exit(2, f"{self.prog}: error: {message}\n")
