"""The one help formatter of every ``beamkit`` command."""

from __future__ import annotations

import argparse
import json
import re
import textwrap
from typing import Any, NoReturn


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


# A negative number as an option's value: argparse's own pattern takes -3 and -0.5 but reads -1e-3 as an option.
NEGATIVE_NUMBER = re.compile(r"^-(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$|^-(?:inf|infinity|nan)$", re.IGNORECASE)


class Parser(argparse.ArgumentParser):
    """An argument parser whose help uses :class:`HelpFormatter`; its sub-parsers are Parsers too. A negative
    number in any notation (``-3``, ``-.5``, ``-1e-3``, ``-inf``) is read as a value, never as an option."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._negative_number_matcher = NEGATIVE_NUMBER

    def error(self, message: str) -> NoReturn:
        """A usage error: one line ``beamkit COMMAND: error: MESSAGE`` on standard error, exit code 2 (argparse
        prints its usage lines first; ``--help`` shows them)."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def format_score(value: float) -> str:
    """A log-probability or score as the commands print it: four decimals (``-0.0742``), or four significant
    digits in scientific notation (``-7.891e-104``) where four decimals would print a non-zero value as 0, so
    that printed scores still rank."""
    if value == 0 or round(value, 4) != 0 or value != value:
        return f"{value:.4f}"
    return f"{value:.3e}"


def shown(text: str, most: int = 60) -> str:
    """``text`` quoted for a message (``repr``), its middle cut to keep it under ``most`` characters."""
    if len(text) <= most:
        return repr(text)
    half = (most - 5) // 2
    return repr(text[:half]) + "..." + repr(text[-half:])


def json_text(value: Any) -> str:
    """``value`` as strict JSON, the only JSON a command prints: a number that is not finite (it would print as
    the non-JSON ``Infinity`` or ``NaN``) is a ValueError saying so."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:
        raise ValueError(
            "a score is not a finite number (infinite or NaN), which JSON cannot hold: lower the weights "
            "(--alpha, --beta, --length-penalty), or check the input"
        ) from None
