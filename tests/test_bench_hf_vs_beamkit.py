"""``bench/hf_vs_beamkit.py``'s run order: each timed call runs in each position equally often."""

from __future__ import annotations

import pytest

from tests.bench_script import load_bench as load_script

pytest.importorskip("torch")
pytest.importorskip("transformers")


def load_bench():
    return load_script("hf_vs_beamkit")


def test_rotation_orders_written_out():
    rotation = load_bench().rotation
    sides = ("hf", "bk", "patched")
    got = [rotation(i, sides) for i in range(4)]
    assert got == [
        ("hf", "bk", "patched"),
        ("bk", "patched", "hf"),
        ("patched", "hf", "bk"),
        ("hf", "bk", "patched"),
    ]


def test_rotation_puts_every_side_in_every_position_once_per_cycle():
    rotation = load_bench().rotation
    sides = ("a", "b", "c", "d")
    orders = [rotation(i, sides) for i in range(len(sides))]
    for position in range(len(sides)):
        assert sorted(order[position] for order in orders) == sorted(sides)
    assert all(sorted(order) == sorted(sides) for order in orders)
