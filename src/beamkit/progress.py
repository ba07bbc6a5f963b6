"""Progress bars for long commands: tqdm on standard error, off when it is not a terminal or with ``--quiet``.

``progress_bar`` returns a tqdm bar (rate and ETA shown) or a silent stand-in with the same ``update`` /
``close``; ``BatchTicker`` moves a bar through one batched search as its model calls happen, so a single large
batch (many inputs, a wide beam) shows progress before it is done.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Protocol

# Seconds a bar waits before it first draws: quick runs stay clean. Tests set it to 0.
DELAY = 1.0


class Progress(Protocol):
    """What the search loops need of a bar."""

    def update(self, n: int = 1) -> Any:
        """Advance by ``n`` units."""

    def close(self) -> None:
        """Finish the bar."""


class Silent:
    """A bar that draws nothing."""

    def update(self, n: int = 1) -> None:
        """Do nothing."""

    def close(self) -> None:
        """Do nothing."""


def progress_enabled(quiet: bool) -> bool:
    """True when bars should draw: not ``quiet`` and standard error is a terminal."""
    isatty = getattr(sys.stderr, "isatty", None)
    return not quiet and callable(isatty) and bool(isatty())


def progress_bar(total: int, desc: str, unit: str = "input", enabled: bool = True) -> Progress:
    """A tqdm bar on standard error (``desc: 40%|####  | 4/10 [00:01<00:02, 3.2input/s]``), or a silent one.

    Silent when ``enabled`` is False or tqdm is not installed (it comes with the ``models`` extra).
    """
    if not enabled:
        return Silent()
    try:
        from tqdm import tqdm
    except ImportError:
        return Silent()
    bar: Progress = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, delay=DELAY, dynamic_ncols=True)
    return bar


class BatchTicker:
    """Advances ``bar`` through one batch of ``rows`` inputs: ``rows / max_len`` per model call, the rest at the end.

    ``wrap(step_fn)`` returns the step function to search with; ``done()`` completes the batch on the bar.
    """

    def __init__(self, bar: Progress, rows: int, max_len: int) -> None:
        self.bar, self.rows, self.per_call = bar, rows, rows / max(1, max_len)
        self.shown, self.exact = 0, 0.0

    def wrap(self, step_fn: Callable[..., Any]) -> Callable[..., Any]:
        """``step_fn`` that also ticks the bar after each call (never past the batch's rows)."""

        def step(*args: Any) -> Any:
            out = step_fn(*args)
            self.exact = min(self.exact + self.per_call, self.rows - 1)
            self._advance(int(self.exact))
            return out

        return step

    def done(self) -> None:
        """Mark every row of the batch as done."""
        self._advance(self.rows)

    def _advance(self, target: int) -> None:
        if target > self.shown:
            self.bar.update(target - self.shown)
            self.shown = target
