"""The dates task: human-written dates in many formats, mapped to ISO ``YYYY-MM-DD``.

Everything is deterministic: :func:`make_example` draws one example from a ``random.Random``, and
:func:`split` returns the fixed train / validation / test splits (seeded, test inputs kept out of train).

Some inputs are genuinely ambiguous, on purpose, because that is where search matters:

* a two-digit year (``'99``, ``3-Mar-99``, ``03/03/99``) does not say its century: the generator draws it
  from :data:`CENTURY_PRIOR` (20xx 44%, 19xx 30%, 18xx 26%). The single most likely answer is 20xx, but
  the first year digit ``1`` carries 56% of the mass, so greedy decoding commits to ``1`` and ends in 19xx;
  a beam keeps ``2`` alive and finds 20xx. This is the task's built-in search error;
* numeric slash formats (``03/04/99``) are month-first (US) with probability :data:`P_MONTH_FIRST` and
  day-first otherwise, so when both numbers are at most 12 the input does not decide the answer.

Dates with a four-digit year are drawn uniformly from 1800-01-01 .. 2099-12-31.
"""

from __future__ import annotations

import datetime as _dt
import random
import re
from collections.abc import Callable
from functools import cache

from beamkit._checks import check_int

FIRST_DAY = _dt.date(1800, 1, 1)
LAST_DAY = _dt.date(2099, 12, 31)
CENTURY_PRIOR = {2000: 0.44, 1900: 0.30, 1800: 0.26}  # the century a two-digit year stands for
P_MONTH_FIRST = 0.6  # slash formats: US order this often, day-first otherwise

SPLIT_SEEDS = {"train": 20_260_101, "valid": 20_260_202, "test": 20_260_303}
SPLIT_SIZES = {"train": 30_000, "valid": 1_000, "test": 2_000}

MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def ordinal(n: int) -> str:
    """Return ``n`` with its English ordinal suffix: 1st, 2nd, 3rd, 4th, 11th, 22nd."""
    if 10 <= n % 100 <= 20:
        suffix = "th"
    else:
        suffix = {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def iso(date: _dt.date) -> str:
    """Return the ISO form ``YYYY-MM-DD`` of ``date`` (the task's target)."""
    return f"{date.year:04d}-{date.month:02d}-{date.day:02d}"


def _yy(d: _dt.date) -> str:
    return f"{d.year % 100:02d}"


def _mon(d: _dt.date) -> str:
    return MONTHS[d.month - 1][:3]


def _month(d: _dt.date) -> str:
    return MONTHS[d.month - 1]


def _wkd(d: _dt.date) -> str:
    return WEEKDAYS[d.weekday()][:3]


def _weekday(d: _dt.date) -> str:
    return WEEKDAYS[d.weekday()]


# Each format renders a date; ``slash`` formats are the ambiguous ones (order chosen at random).
_FORMATS: list[tuple[str, float, Callable[[_dt.date], str]]] = [
    ("ordinal_of", 1.0, lambda d: f"{ordinal(d.day)} of {_month(d)} {d.year}"),
    ("ordinal_of_yy", 0.3, lambda d: f"{ordinal(d.day)} of {_month(d)} '{_yy(d)}"),
    ("d_month_yyyy", 1.0, lambda d: f"{d.day} {_month(d)} {d.year}"),
    ("month_d_yyyy", 1.0, lambda d: f"{_month(d)} {d.day}, {d.year}"),
    ("month_d_yy", 0.4, lambda d: f"{_month(d)} {d.day}, '{_yy(d)}"),
    ("month_ord_yyyy", 0.7, lambda d: f"{_month(d)} {ordinal(d.day)}, {d.year}"),
    ("mon_d_yyyy", 0.8, lambda d: f"{_mon(d)} {d.day} {d.year}"),
    ("d_mon_yyyy", 0.8, lambda d: f"{d.day} {_mon(d)} {d.year}"),
    ("wkd_d_mon_yyyy", 0.8, lambda d: f"{_wkd(d)}, {d.day} {_mon(d)} {d.year}"),
    ("weekday_month_ord", 0.6, lambda d: f"{_weekday(d)}, {_month(d)} {ordinal(d.day)}, {d.year}"),
    ("d_mon_yy_dash", 0.4, lambda d: f"{d.day}-{_mon(d)}-{_yy(d)}"),
    ("yyyy_m_d_dot", 0.8, lambda d: f"{d.year}.{d.month}.{d.day}"),
    ("iso", 0.4, lambda d: iso(d)),
    ("yyyy_mm_dd_slash", 0.4, lambda d: f"{d.year}/{d.month:02d}/{d.day:02d}"),
    ("dd_mm_yyyy_dot", 0.6, lambda d: f"{d.day:02d}.{d.month:02d}.{d.year}"),
    ("slash_yy", 0.8, lambda d: ""),  # rendered by _slash (ambiguous order)
    ("slash_yyyy", 1.2, lambda d: ""),
]
FORMAT_NAMES = [name for name, _, _ in _FORMATS]
TWO_DIGIT_YEAR_FORMATS = frozenset({"ordinal_of_yy", "month_d_yy", "d_mon_yy_dash", "slash_yy"})
_WEIGHTS = [w for _, w, _ in _FORMATS]


def _slash(d: _dt.date, four_digit_year: bool, month_first: bool, padded: bool) -> str:
    a, b = (d.month, d.day) if month_first else (d.day, d.month)
    year = str(d.year) if four_digit_year else _yy(d)
    if padded:
        return f"{a:02d}/{b:02d}/{year}"
    return f"{a}/{b}/{year}"


def _noise(text: str, rng: random.Random) -> str:
    """Apply the task's surface noise: case changes, doubled or stray spaces, a dropped comma."""
    r = rng.random()
    if r < 0.15:
        text = text.lower()
    elif r < 0.25:
        text = text.upper()
    if "," in text and rng.random() < 0.2:
        text = text.replace(",", "", 1)
    if " " in text and rng.random() < 0.15:
        spaces = [i for i, ch in enumerate(text) if ch == " "]
        i = rng.choice(spaces)
        text = text[:i] + " " + text[i:]
    if rng.random() < 0.05:
        text = " " + text
    if rng.random() < 0.05:
        text = text + " "
    return text


def random_date(rng: random.Random) -> _dt.date:
    """Draw a date uniformly from :data:`FIRST_DAY` .. :data:`LAST_DAY`."""
    span = (LAST_DAY - FIRST_DAY).days
    return FIRST_DAY + _dt.timedelta(days=rng.randint(0, span))


def render_date(date: _dt.date, fmt: str, rng: random.Random, noise: bool = True) -> str:
    """Render ``date`` in format ``fmt`` (one of :data:`FORMAT_NAMES`), drawing any choices from ``rng``."""
    if fmt not in FORMAT_NAMES:
        raise ValueError(f"unknown date format {fmt!r}; expected one of {FORMAT_NAMES}")
    if fmt in ("slash_yy", "slash_yyyy"):
        month_first = rng.random() < P_MONTH_FIRST
        text = _slash(date, fmt == "slash_yyyy", month_first, padded=rng.random() < 0.5)
    else:
        text = dict((n, f) for n, _, f in _FORMATS)[fmt](date)
    return _noise(text, rng) if noise else text


def random_two_digit_year_date(rng: random.Random) -> _dt.date:
    """Draw a date whose century follows :data:`CENTURY_PRIOR`, uniform within the drawn year."""
    (century,) = rng.choices(list(CENTURY_PRIOR), weights=list(CENTURY_PRIOR.values()))
    year = century + rng.randint(0, 99)
    start = _dt.date(year, 1, 1)
    return start + _dt.timedelta(days=rng.randint(0, (_dt.date(year, 12, 31) - start).days))


def make_example(rng: random.Random) -> tuple[str, str]:
    """Draw one ``(source, target)`` pair: a human-written date and its ISO form."""
    (fmt,) = rng.choices(FORMAT_NAMES, weights=_WEIGHTS)
    date = random_two_digit_year_date(rng) if fmt in TWO_DIGIT_YEAR_FORMATS else random_date(rng)
    return render_date(date, fmt, rng), iso(date)


def _key(source: str) -> str:
    """Normalise case and spacing, so that noise variants of one held-out input are held out too."""
    return " ".join(source.lower().replace(",", " ").split())


@cache
def _split_cached(name: str) -> tuple[tuple[str, str], ...]:
    size = SPLIT_SIZES[name]
    rng = random.Random(SPLIT_SEEDS[name])
    held_out: set[str] = set()
    if name == "train":  # keep every validation and test input out of the training data
        held_out = {_key(src) for other in ("valid", "test") for src, _ in _split_cached(other)}
    out: list[tuple[str, str]] = []
    while len(out) < size:
        src, tgt = make_example(rng)
        if _key(src) not in held_out:
            out.append((src, tgt))
    return tuple(out)


def split(name: str, limit: int | None = None) -> list[tuple[str, str]]:
    """Return the fixed split ``name`` ("train", "valid" or "test") as ``(source, target)`` pairs.

    ``limit`` keeps only the first ``limit`` pairs. The splits are the same on every machine and run.
    """
    if name not in SPLIT_SIZES:
        raise ValueError(f"unknown split {name!r}; expected one of {sorted(SPLIT_SIZES)}")
    pairs = list(_split_cached(name))
    if limit is not None:
        check_int("limit", limit, 1)
        pairs = pairs[:limit]
    return pairs


def is_ambiguous(source: str) -> bool:
    """Return True when ``source`` is a numeric slash date whose day/month order the text does not decide."""
    parts = source.strip().split("/")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        return False
    a, b = int(parts[0]), int(parts[1])
    return a != b and a <= 12 and b <= 12


def lm_corpus() -> list[str]:
    """The targets of the training split as space-separated characters, for a target-side ``beamkit lm build``."""
    return [" ".join(target) for _, target in split("train")]


def lm_vocab() -> list[str]:
    """The LM word of each target id of the dates models: ``<bos>`` / ``<eos>`` are the LM's ``<s>`` / ``</s>``."""
    from beamkit.models.vocab import target_vocab

    names = {"<bos>": "<s>", "<eos>": "</s>"}
    return [names.get(sym, sym) for sym in target_vocab().symbols]


_DATE_WORDS = frozenset(w.lower() for name in MONTHS + WEEKDAYS for w in (name, name[:3]))
_YEAR = re.compile(r"(?<!\d)\d{4}(?!\d)")
_MONTH_OF = {w.lower(): i + 1 for i, name in enumerate(MONTHS) for w in (name, name[:3])}
_MONTH_WORD = "|".join(sorted(_MONTH_OF, key=len, reverse=True))
# three numbers joined by one separator: 2024-13-45, 03/04/99, 31.12.1999
_NUMERIC = re.compile(r"(?<![\d.\-/])(\d+)\s*([/.\-])\s*(\d+)\s*\2\s*(\d+)(?![\d.\-/])")
# a day written as a number beside a month name: 31 February, 31st of Feb, February 31st
_DAY_MONTH = re.compile(rf"(?<![\d\w])(\d+)(?:st|nd|rd|th)?\s*(?:of\s+)?-?({_MONTH_WORD})\b", re.IGNORECASE)
_MONTH_DAY = re.compile(rf"\b({_MONTH_WORD})\.?\s*(\d+)(?:st|nd|rd|th)?(?!\d)", re.IGNORECASE)


def _days_in(month: int, year: int | None) -> int:
    """Days of ``month`` in ``year``; without a year (a two-digit one names no century), February has 29."""
    if month == 2 and year is None:
        return 29
    import calendar

    return calendar.monthrange(year if year is not None else 2000, month)[1]


def _day_reason(day: int, month: int, year: int | None) -> str | None:
    """Why ``day`` is not a day of ``month`` (1-12, checked) in ``year``, or None."""
    last = _days_in(month, year)
    if 1 <= day <= last:
        return None
    where = f"{MONTHS[month - 1]} {year}" if year is not None else MONTHS[month - 1]
    return f"{where} has no day {day} (it has {last} days)"


def _numeric_reason(text: str) -> str | None:
    """Why the numbers of ``text`` cannot be a day, a month and a year, or None."""
    for number in re.findall(r"\d+", text):
        if len(number) > 4:
            cut = number if len(number) <= 12 else f"{number[:4]}...{number[-4:]} ({len(number)} digits)"
            return f"the number {cut} is not a day, a month or a year"
    for match in _NUMERIC.finditer(text):
        first, sep, second, third = match.groups()
        a, b, c = int(first), int(second), int(third)
        if len(first) == 4:  # year first: year, month, day
            if not 1 <= b <= 12:
                return f"{match.group(0)} has no month {b} (months are 1-12)"
            reason = _day_reason(c, b, a)
            if reason is not None:
                return reason
            continue
        year = c if len(third) == 4 else None
        if len(third) not in (2, 4):
            return f"{match.group(0)} has no year (two or four digits last)"
        orders = [(b, a)] if sep == "." else [(a, b), (b, a)]  # (month, day): dots are day-first
        if not any(1 <= m <= 12 and _day_reason(d, m, year) is None for m, d in orders):
            if not any(1 <= m <= 12 for m, _ in orders):
                return f"{match.group(0)} has no month ({' and '.join(str(m) for m, _ in orders)} > 12)"
            month, day = next((m, d) for m, d in orders if 1 <= m <= 12)
            return _day_reason(day, month, year)
    years = [int(y) for y in _YEAR.findall(text)]
    year = years[0] if len(years) == 1 else None
    with_day = set()  # months written after their day (3 Mar 99): a number after them is the year
    for match in _DAY_MONTH.finditer(text):
        with_day.add(match.start(2))
        if len(match.group(1)) < 4:
            reason = _day_reason(int(match.group(1)), _MONTH_OF[match.group(2).lower()], year)
            if reason is not None:
                return reason
    for match in _MONTH_DAY.finditer(text):
        day = int(match.group(2))
        if match.start(1) not in with_day and day <= 31:  # above 31: a two-digit year (March 99)
            reason = _day_reason(day, _MONTH_OF[match.group(1).lower()], year)
            if reason is not None:
                return reason
    return None


def out_of_range_reason(text: str) -> str | None:
    """Why the dates models cannot mean ``text``, or None when they can: it has no date-like token (no digit and
    no month or weekday name), a four-digit year outside the years they were trained on (:data:`FIRST_DAY` ..
    :data:`LAST_DAY`), a number too long to be part of a date, or a month or day written as a number that is out
    of range (``2024-13-45``, ``33/33/33``, ``31 February 2001``)."""
    first, last = FIRST_DAY.year, LAST_DAY.year
    words = set(re.findall(r"[a-z]+", text.lower()))
    if not any(ch.isdigit() for ch in text) and not words & _DATE_WORDS:
        return "it has no date-like token (a digit, or a month or weekday name)"
    for year in _YEAR.findall(text):
        if not first <= int(year) <= last:
            return f"the year {year} is outside the supported years {first}-{last}"
    return _numeric_reason(text)


def output_reason(output: str) -> str | None:
    """Why a dates model's output is not an answer, or None when it is: it must be ``YYYY-MM-DD``, a real
    calendar date from :data:`FIRST_DAY` to :data:`LAST_DAY`."""
    match = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})", output)
    if match is None:
        return f"the output {output!r} is not a date written YYYY-MM-DD"
    try:
        day = _dt.date(*(int(g) for g in match.groups()))
    except ValueError:
        return f"the output {output} is not a calendar date"
    if not FIRST_DAY <= day <= LAST_DAY:
        return f"the output {output} is outside the supported years {FIRST_DAY.year}-{LAST_DAY.year}"
    return None
