"""``bench/wide_beam.py``'s helpers: the multiply-add count against a hand count, and a tiny run of the script."""

from __future__ import annotations

import sys

import pytest

from tests.bench_script import load_bench

pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_multiply_adds_by_hand():
    bench = load_bench("wide_beam")
    d, layers, v = bench.WIDTH, bench.LAYERS, bench.VOCAB
    # one request, width 3, prompt 2, 3 new tokens: the prompt's 2 positions through 12 d^2 per layer, causal
    # attention 2^2 d per layer, one output row; then steps over contexts 3 and 4 for 3 rows each
    prompt = 2 * 12 * d * d * layers + layers * 4 * d + d * v
    steps = sum(3 * (12 * d * d * layers + 2 * c * d * layers + d * v) for c in (3, 4))
    assert bench.multiply_adds(1, 3, 2, 3) == prompt + steps


def test_a_tiny_run_prints_the_table_and_the_figures(monkeypatch, capsys):
    bench = load_bench("wide_beam")
    monkeypatch.setattr(bench, "matmul_rate", lambda seconds=1.0: 1e9)
    argv = ["wide_beam.py", "--widths", "2,3", "--prompts", "20", "--new", "2", "--hf-max", "3", "--requests", "1"]
    monkeypatch.setattr(sys, "argv", argv)
    bench.main()
    out = capsys.readouterr().out
    assert "| 2 |" in out and "| 3 |" in out and "100.0 %" in out  # Hugging Face's n-best, the same
    assert "wide-beam[vs-gather,w2,p20,n2]" in out and "differ" not in out
