"""``bench/vs_ct2.py``: its helpers against hand-worked cases, and its tiny configuration run end to end."""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest

from tests.bench_script import load_bench

pytest.importorskip("torch")
pytest.importorskip("transformers")
HAS_CT2 = importlib.util.find_spec("ctranslate2") is not None and importlib.util.find_spec("tokenizers") is not None


def test_rotation_puts_each_side_in_each_position_once_per_cycle():
    rotation = load_bench("vs_ct2").rotation
    sides = ["hf", "beamkit", "ct2"]
    assert [rotation(i, sides) for i in range(4)] == [
        ("hf", "beamkit", "ct2"),
        ("beamkit", "ct2", "hf"),
        ("ct2", "hf", "beamkit"),
        ("hf", "beamkit", "ct2"),
    ]


def test_verdicts_by_hand():
    verdict = load_bench("vs_ct2").verdict
    # beamkit 1.6x Hugging Face (target 1.5x: met); CTranslate2 takes 0.9x beamkit's time at GPT-2-small size
    # (beamkit slower: target 1.0x missed), 0.6x on the tiny model (within 2x: target 0.5x met)
    assert verdict("gpt2-small", 1.6, 0.9) == [("hf-speedup", 1.6, 1.5, True), ("bk-vs-ct2", 0.9, 1.0, False)]
    assert verdict("tiny", 1.4, 0.6) == [("hf-speedup", 1.4, 1.5, False), ("bk-vs-ct2", 0.6, 0.5, True)]
    assert verdict("marian", 1.5, None) == [("hf-speedup", 1.5, 1.5, True)]  # no CTranslate2: no second target


def test_rows_equal_counts_whole_rows():
    rows_equal = load_bench("vs_ct2").rows_equal
    assert rows_equal([[1, 2], [3, 4], [5]], [[1, 2], [3, 5], [5]]) == 2
    with pytest.raises(ValueError, match="2 rows against 1"):
        rows_equal([[1], [2]], [[1]])


def tiny_run(monkeypatch, capsys, *extra: str) -> str:
    bench = load_bench("vs_ct2")
    monkeypatch.setattr(bench, "NEW", 6)  # a short fixed length: the configuration, not the figures, is tested
    bench.main(["--models", "tiny", "--repeats", "1", *extra])
    return capsys.readouterr().out


def test_tiny_run_without_ctranslate2_says_so(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import ctranslate2 raises ImportError
    out = tiny_run(monkeypatch, capsys, "--modes", "greedy")
    assert "ctranslate2 not installed" in out
    assert "rows equal to Hugging Face's: beamkit 8/8;" in out
    assert "hf-speedup[tiny/greedy]:" in out and "bk-vs-ct2" not in out
    assert "targets met:" in out and "of 1" in out


@pytest.mark.skipif(not HAS_CT2, reason="ctranslate2 not installed")
def test_tiny_run_with_ctranslate2_compares_every_system(monkeypatch, capsys):
    out = tiny_run(monkeypatch, capsys, "--int8")
    for label in ("tiny/beam", "tiny/greedy"):
        line = next(s for s in out.splitlines() if s.startswith(f"[{label}] wall ms"))
        assert "hf " in line and "beamkit " in line and "ct2 " in line and "ct2-int8 " in line
        assert "beamkit-int8 " in line and re.search(r"beamkit-int8 [0-8]/8", line)  # int8 agreement counted
        assert "beamkit 8/8" in line  # beamkit is tensor-equal to Hugging Face (the bench stops otherwise)
        assert f"hf-speedup[{label}]:" in out and f"bk-vs-ct2[{label}]:" in out
        assert f"bk-int8-vs-ct2-int8[{label}]:" in out and f"bk-int8-speedup[{label}]:" in out
    assert "of 4" in out  # int8 figures set no target


def test_int8_without_ctranslate2_still_times_beamkits_int8(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)
    out = tiny_run(monkeypatch, capsys, "--modes", "greedy", "--int8")
    line = next(s for s in out.splitlines() if s.startswith("[tiny/greedy] wall ms"))
    assert "beamkit-int8 " in line and re.search(r"beamkit-int8 [0-8]/8", line)
    assert "bk-int8-speedup[tiny/greedy]:" in out and "bk-int8-vs-ct2-int8" not in out


def test_unknown_model_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as err:
        load_bench("vs_ct2").main(["--models", "gpt3"])
    assert err.value.code == 2
    assert "unknown model 'gpt3'" in capsys.readouterr().err


def test_tiny_run_with_the_compiled_step_prints_its_figures(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # the CTranslate2 columns are not what is tested here
    out = tiny_run(monkeypatch, capsys, "--modes", "greedy", "--compile", "eager")
    assert re.search(r"beamkit-compiled \d+ \(\d+\)", out)  # its timings
    assert re.search(r"rows equal to Hugging Face's: beamkit 8/8, beamkit-compiled [0-8]/8;", out)
    assert "first beamkit-compiled call (compiling included):" in out
    assert re.search(r"bk-compiled-speedup\[tiny/greedy\]: \d+\.\d\dx", out)
    assert re.search(r"hf-speedup-compiled\[tiny/greedy\]: \d+\.\d\dx; target >= 1\.5x: (met|missed)", out)
    assert "targets met: " in out and re.search(r"targets met with compile=eager: [01] of 1", out)
