"""``bench/generative_retrieval.py``: its semantic IDs are what it says, and its quick run checks what it reports
(every beamkit output in the dictionary, the comparison with ``model.generate`` made)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.bench_script import load_bench as load_script


def load_bench():
    return load_script("generative_retrieval")


def test_semantic_ids_are_distinct_and_each_level_has_its_own_codes():
    bench = load_bench()
    ids = bench.semantic_ids(5000, 3, seed=4, stop=True)
    assert ids.shape == (5000, 4) and (ids[:, -1] == bench.EOS).all()
    assert len(np.unique(ids, axis=0)) == 5000
    for level in range(3):
        assert ids[:, level].min() >= 1 + 256 * level and ids[:, level].max() < 1 + 256 * (level + 1)


def test_the_quick_run_reports_valid_outputs_and_agreement(capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    rows = load_bench().main(["--quick"])
    assert rows["compare"]["valid"] and all(r["valid"] for r in rows["throughput"])
    assert rows["compare"]["route"] == "engine"  # beamkit's side is timed on its engine, not on the loop
    layers = {r["mode"]: r for r in rows["output_layer"]}
    assert layers["vocab"]["top1"] == layers["vocab"]["prompts"] and layers["vocab"]["overlap"] == 1.0
    assert all(r["valid"] for r in rows["output_layer"])
    assert rows["compare"]["top1"] == rows["compare"]["prompts"]  # tiny sizes: the same best ID as generate
    assert rows["builds"][0]["items"] == 2000
    assert "speedup[" in capsys.readouterr().out
