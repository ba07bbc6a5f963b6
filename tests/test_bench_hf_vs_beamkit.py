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


def test_the_whisper_preset_runs_with_a_compiled_fourth_call(capsys):
    """``--compile eager`` on the Whisper preset, two timed runs: the four calls' figures and the compiled
    call's agreement count are printed, and the ratios are positive."""
    import torch

    bench = load_bench()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        speed, patched, ov, hf_ov, compiled = bench.run("whisper", 2, compile_backend="eager")
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "compile=eager: first call" in out and "hf-speedup-compiled[whisper]" in out
    assert "its outputs equal Hugging Face's in" in out
    assert min(speed, patched, compiled) > 0 and 0 <= ov < 1 and 0 <= hf_ov < 1
