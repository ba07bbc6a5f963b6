"""The checks every room runs on its arguments: one place for "must be an integer >= 1" and its friends.

Each returns the value in its plain Python type, or raises TypeError (wrong kind) or ValueError (out of range)
naming the argument, so a caller writes ``beam = check_int("beam_size", beam, 1)`` instead of an ``if``.
"""

from __future__ import annotations

import math
from collections.abc import Collection
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
    name: str, value: Any, least: float | None = None, most: float | None = None, minus_inf: bool = False
) -> float:
    """``value`` as a float: a number (else TypeError) that is finite, or -inf when ``minus_inf``, and within
    ``least .. most`` where given (else ValueError naming ``name``)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if math.isnan(value) or (math.isinf(value) and not (minus_inf and value < 0)):
        allowed = "a finite number or -inf" if minus_inf else "a finite number"
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    if least is not None and value < least:
        raise ValueError(f"{name} must be >= {least}, got {value}")
    if most is not None and value > most:
        raise ValueError(f"{name} must be <= {most}, got {value}")
    return float(value)


def check_bool(name: str, value: Any) -> bool:
    """``value`` as a bool: True or False (numpy's too), else TypeError naming ``name``."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_choice(name: str, value: T, choices: Collection[T]) -> T:
    """``value`` when it is one of ``choices``, else ValueError naming ``name`` and listing the choices."""
    try:
        known = value in choices
    except TypeError:  # an unhashable value asked of a set
        known = False
    if not known:
        listed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {listed}, got {value!r}")
    return value
