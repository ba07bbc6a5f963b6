"""argparse ``type=`` functions: each parses one option value with the checks of :mod:`beamkit._checks`, so a bad
value is a usage error (exit 2) with one line naming the option, before any model loads."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from beamkit._checks import check_float, check_int


def _parsed(kind: Callable[[str], Any], text: str, what: str) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def _checked(check: Callable[..., Any], value: Any, **bounds: Any) -> Any:
    try:
        return check("the value", value, **bounds)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("the value must be", "expected")) from None


def positive_int(text: str) -> int:
    """An integer >= 1 (a beam width, a count)."""
    return int(_checked(check_int, _parsed(int, text, "an integer"), least=1))


def non_negative_int(text: str) -> int:
    """An integer >= 0 (an index, a seed)."""
    return int(_checked(check_int, _parsed(int, text, "an integer"), least=0))


def finite_float(text: str) -> float:
    """A finite number (a length-penalty alpha, an LM weight)."""
    return float(_checked(check_float, _parsed(float, text, "a number")))


def non_negative_float(text: str) -> float:
    """A finite number >= 0."""
    return float(_checked(check_float, _parsed(float, text, "a number"), least=0.0))


def non_positive_float(text: str) -> float:
    """A finite number <= 0 (a log-probability threshold)."""
    return float(_checked(check_float, _parsed(float, text, "a number"), most=0.0))


def lm_weight(text: str) -> float:
    """A language model weight (``--alpha``, ``--beta``): a finite number between -1000 and 1000, the bound of
    :class:`beamkit.ctc.LanguageModelFusion` (beyond it sums of word scores leave the float range)."""
    from beamkit.ctc.lm import MAX_LM_WEIGHT

    return float(_checked(check_float, _parsed(float, text, "a number"), least=-MAX_LM_WEIGHT, most=MAX_LM_WEIGHT))


# The widest beam a text command searches: a beam of 100,000 on the dates model takes about 40 s and 1.3 GB for
# one input; 10**8 ran for minutes past 3.5 GB without an answer. (CTC's own bound is the same number.)
MAX_SEARCH_BEAM = 100_000


def bounded_int(least: int, most: int) -> Callable[[str], int]:
    """The type of an integer option between ``least`` and ``most`` (a beam width with a memory bound)."""

    def parse(text: str) -> int:
        value = int(_parsed(int, text, "an integer"))
        if not least <= value <= most:
            raise argparse.ArgumentTypeError(f"expected an integer from {least} to {most:,}, got {value}")
        return value

    return parse


def learning_rate(text: str) -> float:
    """A peak learning rate: a number above 0 and at most :data:`beamkit.tasks.train.MAX_LR`."""
    from beamkit.tasks.train import MAX_LR

    return float(_checked(check_float, _parsed(float, text, "a number"), above=0.0, most=MAX_LR))
