"""The dates task: formats checked against datetime's own parser, fixed splits, the designed ambiguity."""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter

import pytest

from beamkit.tasks import dates

# An independent parser for every unambiguous, four-digit-year format: strptime patterns.
STRPTIME = {
    "ordinal_of": None,  # ordinal suffix: handled below
    "d_month_yyyy": "%d %B %Y",
    "month_d_yyyy": "%B %d, %Y",
    "mon_d_yyyy": "%b %d %Y",
    "d_mon_yyyy": "%d %b %Y",
    "wkd_d_mon_yyyy": "%a, %d %b %Y",
    "yyyy_m_d_dot": "%Y.%m.%d",
    "iso": "%Y-%m-%d",
    "yyyy_mm_dd_slash": "%Y/%m/%d",
    "dd_mm_yyyy_dot": "%d.%m.%Y",
}


def test_ordinal_suffixes_by_hand():
    got = [dates.ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 31, 111)]
    assert got == ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "31st", "111th"]


@pytest.mark.parametrize("fmt", sorted(k for k, v in STRPTIME.items() if v))
def test_four_digit_formats_parse_back_with_strptime(fmt):
    rng = random.Random(7)
    for _ in range(200):
        day = dates.random_date(rng)
        text = dates.render_date(day, fmt, rng, noise=False)
        assert dt.datetime.strptime(text, STRPTIME[fmt]).date() == day, text


def test_hand_written_examples_from_the_issue():
    day = dt.date(1999, 3, 3)
    rng = random.Random(0)
    assert dates.render_date(day, "ordinal_of", rng, noise=False) == "3rd of March 1999"
    assert dates.render_date(day, "wkd_d_mon_yyyy", rng, noise=False) == "Wed, 3 Mar 1999"  # 1999-03-03 was a Wednesday
    assert dates.render_date(day, "yyyy_m_d_dot", rng, noise=False) == "1999.3.3"
    assert dates.render_date(day, "month_d_yy", rng, noise=False) == "March 3, '99"
    assert dates.iso(day) == "1999-03-03"


def test_weekday_formats_name_the_real_weekday():
    rng = random.Random(3)
    for _ in range(100):
        day = dates.random_date(rng)
        text = dates.render_date(day, "weekday_month_ord", rng, noise=False)
        assert text.split(",")[0] == day.strftime("%A")


def test_splits_are_fixed_sized_and_disjoint():
    test = dates.split("test")
    assert len(test) == dates.SPLIT_SIZES["test"] == 2000
    assert test[:5] == dates.split("test", limit=5)
    dates._split_cached.cache_clear()
    assert dates.split("test") == test  # regenerated from the seed: identical
    train_keys = {dates._key(s) for s, _ in dates.split("train")}
    assert not train_keys & {dates._key(s) for s, _ in test}
    assert not train_keys & {dates._key(s) for s, _ in dates.split("valid")}


def test_targets_are_valid_iso_dates():
    for _, tgt in dates.split("valid"):
        assert dt.date.fromisoformat(tgt).isoformat() == tgt


def test_two_digit_years_follow_the_century_prior():
    rng = random.Random(11)
    n = 20_000
    counts = Counter(dates.random_two_digit_year_date(rng).year // 100 * 100 for _ in range(n))
    for century, p in dates.CENTURY_PRIOR.items():
        assert abs(counts[century] / n - p) < 0.015
    # greedy's trap: the first year digit "1" carries more mass than "2", yet 20xx is the single best century
    assert dates.CENTURY_PRIOR[2000] > max(dates.CENTURY_PRIOR[1900], dates.CENTURY_PRIOR[1800])
    assert dates.CENTURY_PRIOR[1900] + dates.CENTURY_PRIOR[1800] > dates.CENTURY_PRIOR[2000]


def test_slash_order_is_month_first_sixty_percent():
    rng = random.Random(5)
    month_first = 0
    n = 5000
    for _ in range(n):
        day = dt.date(2000, 1, 20)  # day > 12: the order is visible in the text
        text = dates.render_date(day, "slash_yyyy", rng, noise=False)
        month_first += int(text.split("/")[0]) == 1
    assert abs(month_first / n - dates.P_MONTH_FIRST) < 0.03


def test_is_ambiguous_by_hand():
    assert dates.is_ambiguous("03/04/99")
    assert dates.is_ambiguous(" 3/4/1999 ")
    assert not dates.is_ambiguous("03/03/99")  # both orders agree
    assert not dates.is_ambiguous("13/04/99")
    assert not dates.is_ambiguous("3rd of March 1999")


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown split"):
        dates.split("dev")
    with pytest.raises(ValueError, match="limit"):
        dates.split("test", limit=0)
    with pytest.raises(ValueError, match="unknown date format"):
        dates.render_date(dt.date(2000, 1, 1), "nope", random.Random(0))


def test_noise_keeps_the_characters_printable_ascii():
    for src, _ in dates.split("test"):
        assert src.strip() and all(" " <= ch <= "~" for ch in src)
