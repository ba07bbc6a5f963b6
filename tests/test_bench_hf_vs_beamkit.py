"""``bench/hf_vs_beamkit.py``'s run order: each timed call runs in each position equally often."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "hf_vs_beamkit.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("hf_vs_beamkit", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
