"""The checks every room runs on its arguments: one place for "must be an integer >= 1" and its friends.

Each returns the value in its plain Python type, or raises TypeError (wrong kind) or ValueError (out of range)
naming the argument, so a caller writes ``beam = check_int("beam_size", beam, 1)`` instead of an ``if``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")


def is_int(value: Any) -> bool:
    """True for a Python or numpy integer that is not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_int(name: str, value: Any, least: int | None = None, most: int | None = None) -> int:
    """``value`` as an int: an integer (else TypeError) within ``least .. most`` where given (else ValueError
    naming ``name``)."""
    if not is_int(value):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if least is not None and most is not None and not least <= value <= most:
        raise ValueError(f"{name} must be between {least} and {most}, got {value}")
    if least is not None and value < least:
        raise ValueError(f"{name} must be >= {least}, got {value}")
    if most is not None and value > most:
        raise ValueError(f"{name} must be <= {most}, got {value}")
    return int(value)


def check_float(
    name: str,
    value: Any,
    *,
    least: float | None = None,
    most: float | None = None,
    minus_inf: bool = False,
    above: float | None = None,
) -> float:
    """``value`` as a float: a number (else TypeError) that is finite, or -inf when ``minus_inf``, within
    ``least .. most`` where given and greater than ``above`` where given (else ValueError naming ``name``). The
    bounds are keywords: ``check_float(name, x, -1.0)`` cannot be misread as ``minus_inf``."""
    value = check_number(name, value)
    allowed = "a finite number or -inf" if minus_inf else "a finite number"
    finite = not math.isnan(value) and (not math.isinf(value) or (minus_inf and value < 0))
    if least is not None and most is not None and not (finite and least <= value <= most):
        raise ValueError(f"{name} must be {allowed} between {least:g} and {most:g}, got {value}")
    if not finite:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    if least is not None and value < least:
        raise ValueError(f"{name} must be >= {least}, got {value}")
    if above is not None and most is not None and not above < value <= most:
        raise ValueError(f"{name} must be > {above} and <= {most}, got {value}")
    if above is not None and not value > above:
        raise ValueError(f"{name} must be > {above}, got {value}")
    if most is not None and value > most:
        raise ValueError(f"{name} must be <= {most}, got {value}")
    return value


def check_number(name: str, value: Any) -> float:
    """``value`` as a float: any real number, infinities and NaN included (a bool or a non-number is a TypeError
    naming ``name``)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    return float(value)


def check_optional_int(name: str, value: Any, least: int | None = None, most: int | None = None) -> int | None:
    """None, or ``value`` checked as :func:`check_int` does."""
    return None if value is None else check_int(name, value, least, most)


def check_ids(name: str, value: Any) -> tuple[int, ...]:
    """A sequence of token ids (integers >= 0) as a tuple of ints; TypeError for a string or a non-sequence or
    a non-integer id, ValueError for a negative id, each naming ``name``."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise TypeError(f"{name} must be a sequence of token ids, got {value!r}")
    ids = tuple(value)
    if not all(is_int(t) for t in ids):
        raise TypeError(f"{name}: token ids must be integers, got {value!r}")
    if any(t < 0 for t in ids):
        raise ValueError(f"{name}: token ids must be >= 0, got {value!r}")
    return tuple(int(t) for t in ids)


def check_id_lists(name: str, value: Any) -> tuple[tuple[int, ...], ...]:
    """A sequence of token-id sequences as a tuple of tuples (each checked by :func:`check_ids`)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise TypeError(f"{name} must be a sequence of token-id sequences, got {value!r}")
    return tuple(check_ids(name, seq) for seq in value)


def check_bool(name: str, value: Any) -> bool:
    """``value`` as a bool: True or False (numpy's too), else TypeError naming ``name``."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_choice(name: str, value: T, choices: Collection[T]) -> T:
    """``value`` when it is one of ``choices`` (compared with ``==``), else ValueError naming ``name`` and listing
    the choices (``mode must be 'a', 'b' or 'c', got 'd'``)."""
    try:
        known = value in choices
    except TypeError:  # an unhashable value asked of a set
        known = False
    if not known:
        names = [repr(c) for c in choices]
        listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
        raise ValueError(f"{name} must be {listed}, got {value!r}")
    return value
