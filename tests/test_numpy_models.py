"""The numpy backend of the dates models against the torch modules (the oracle: the same weights run by torch),
and the numpy path without torch at all (a subprocess where importing torch fails).

Tolerances are argued from float32 rounding, not tuned. With u = 2**-24 (float32 unit roundoff), a dot
product of n terms computed in two different orders (OpenBLAS for numpy, torch's own kernels) differs by about
sqrt(n) * u * sum|a_i b_i| (rounding errors add like a random walk; Higham & Mary 2019), and such differences
pass through the D matrix products that lie one after another between the weights and the logits. With M the
largest |logit| (the scale of sum|a_i b_i| at the output), the logits of one step then differ by at most

    tau = sqrt(n * D) * u * M * SAFETY,            SAFETY = 8

where n is the longest accumulation of the model and D its sequential depth (for the LSTM: every encoder time
step, every decoder step and the four products of a step). A token's log-probability ``x_v - logsumexp(x)``
moves by at most 2 tau when every logit moves by tau, plus V * u for the float32 sum inside the engine's
log-sum-exp; a hypothesis sums at most max_len of them (its score divides that by a length >= 1), so

    |logprob_numpy - logprob_torch| <= max_len * (2 tau + V * u).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from beamkit import Engine, search_batch
from beamkit.adapters import translate
from beamkit.models import checkpoint, load_model, resolve_model
from beamkit.models.common import encode_sources, pad_batch
from beamkit.models.numpy_seq2seq import NumpySeq2Seq
from beamkit.models.numpy_transformer import NumpyTransformer
from beamkit.tasks import dates

MODELS = ["dates-seq2seq", "dates-transformer"]
U = 2.0**-24
SAFETY = 8
SRC = Path(__file__).resolve().parents[1] / "src"


def _torch():
    torch = pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    torch.set_num_threads(1)
    return torch


def _shape(model, max_src: int) -> tuple[int, int]:
    """(n, D) of the tolerance argument for ``model``: longest accumulation, sequential matmul depth."""
    if model.arch == "seq2seq":
        h, e = model.config["hidden"], model.config["emb"]
        # gates sum x @ W_ih (E + H terms) and h @ W_hh (H terms); every time step is one more product deep
        return e + 2 * h, max_src + int(model.meta.get("max_len", 12)) + 4
    c = model.config
    # per encoder layer: q/k/v, scores, weights @ v, o, ff in, ff out; per decoder layer 3 more for cross attention
    return max(c["d_model"], c["ff"]), 6 * c["enc_layers"] + 9 * c["dec_layers"] + 1


def _tau(model, max_src: int, logit_scale: float) -> float:
    n, depth = _shape(model, max_src)
    return math.sqrt(n * depth) * U * logit_scale * SAFETY


def _inputs(model, texts):
    return pad_batch(encode_sources(model.src_vocab, texts), model.src_vocab.pad)


@pytest.fixture(scope="module")
def test_sources():
    return [s for s, _ in dates.split("test")]


@pytest.fixture(scope="module", params=MODELS)
def pair(request):
    """(numpy model, torch model) of one shipped checkpoint."""
    torch = _torch()
    return load_model(request.param, backend="numpy"), load_model(request.param, backend="torch"), torch


def _logits_along_greedy_path(pair, texts, steps):
    np_model, t_model, torch = pair
    src, lengths = _inputs(np_model, texts)
    a = np_model.init_state(src, lengths)
    with torch.inference_mode():
        b = t_model.init_state(torch.as_tensor(src), torch.as_tensor(lengths))
        y = np.full(len(texts), np_model.tgt_vocab.bos)
        out = []
        for _ in range(steps):
            la, a = np_model.step(a, y)
            lb, b = t_model.step(b, y)
            lb = lb.numpy()
            out.append((la, lb))
            y = lb.argmax(axis=1)  # the torch model's greedy path: both get the same inputs
    return out, int(src.shape[1])


def test_per_step_logits_are_close_to_torch(pair, test_sources):
    np_model = pair[0]
    steps, max_src = _logits_along_greedy_path(pair, test_sources[:300], 12)
    scale = max(float(np.abs(lb).max()) for _, lb in steps)
    tau = _tau(np_model, max_src, scale)
    for t, (la, lb) in enumerate(steps):
        assert la.dtype == np.float32 and la.shape == lb.shape
        worst = float(np.abs(la - lb).max())
        assert worst <= tau, f"step {t}: max |numpy - torch| = {worst:.3g} > tau = {tau:.3g}"
    assert tau < 1e-3 * scale  # the bound is tight enough to mean something


def test_whole_test_split_beam_5_equals_torch(pair, test_sources):
    np_model, t_model, _ = pair
    assert len(test_sources) == dates.SPLIT_SIZES["test"]
    got = translate(np_model, test_sources, beam_size=5)
    want = translate(t_model, test_sources, beam_size=5)
    steps, max_src = _logits_along_greedy_path(pair, test_sources[:300], 12)
    scale = max(float(np.abs(lb).max()) for _, lb in steps)
    max_len = int(np_model.meta["max_len"])
    bound = max_len * (2 * _tau(np_model, max_src, scale) + len(np_model.tgt_vocab) * U)
    worst_logprob = worst_score = 0.0
    for source, a, b in zip(test_sources, got, want, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b], source
        assert [h.finished for h in a] == [h.finished for h in b], source
        worst_logprob = max(worst_logprob, *(abs(x.logprob - y.logprob) for x, y in zip(a, b, strict=True)))
        worst_score = max(worst_score, *(abs(x.score - y.score) for x, y in zip(a, b, strict=True)))
    assert worst_logprob <= bound, (worst_logprob, bound)
    assert worst_score <= bound, (worst_score, bound)


def _untrained_pair(torch, arch, tmp_path):
    from beamkit.models.seq2seq import Seq2Seq
    from beamkit.models.transformer import Transformer
    from beamkit.models.vocab import source_vocab, target_vocab

    torch.manual_seed(1)
    sv, tv = source_vocab(), target_vocab()
    if arch == "seq2seq":
        model = Seq2Seq(sv, tv, emb=8, hidden=16, layers=2)
    else:
        model = Transformer(sv, tv, d_model=16, heads=2, ff=32, enc_layers=1, dec_layers=3, max_len=40)
    with torch.no_grad():
        model.out.weight.mul_(8.0)  # far from uniform, so a wrong layer shows in the logits
    folder = checkpoint.save(model.eval(), tmp_path / arch, {"max_len": 12})
    return load_model(folder, backend="numpy"), load_model(folder, backend="torch"), torch


@pytest.mark.parametrize("arch", ["seq2seq", "transformer"])
def test_other_sizes_and_layer_counts_match_torch(tmp_path, arch):
    pair = _untrained_pair(_torch(), arch, tmp_path)
    texts = ["3rd of March 1999", "x", "Tuesday, 14 September 2021", "1/2/03"]
    steps, max_src = _logits_along_greedy_path(pair, texts, 12)
    scale = max(float(np.abs(lb).max()) for _, lb in steps)
    tau = _tau(pair[0], max_src, scale)
    assert max(float(np.abs(la - lb).max()) for la, lb in steps) <= tau
    a, b = translate(pair[0], texts, beam_size=4), translate(pair[1], texts, beam_size=4)
    assert [[h.tokens for h in r] for r in a] == [[h.tokens for h in r] for r in b]


# ------------------------------------------------------------------------------------------ numpy only
JOIN_SOURCES = [
    "3rd of March 1999",
    "1/2/03",
    "Tuesday, 14 September 2021",
    "march 7 1987",
    "the 21st of december 2010",
    "12.10.1955",
    "Sat Jan 1 2000",
]


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("seed", range(2))
def test_requests_joining_mid_flight_equal_alone(name, seed):
    model = load_model(name, backend="numpy")
    assert isinstance(model, (NumpySeq2Seq, NumpyTransformer))
    rng = np.random.default_rng(seed)
    tv = model.tgt_vocab
    plan = [
        {"text": t, "arrive": int(rng.integers(0, 8)), "beam": int(rng.integers(1, 6)), "lp": float(rng.choice([0, 1]))}
        for t in JOIN_SOURCES
    ]

    def state(text):
        return model.init_state(*_inputs(model, [text]))

    engine = Engine(model.step, max_len=12, policy="pool")
    ids, done = {}, {}
    for step in range(60):
        for i, p in enumerate(plan):
            if p["arrive"] == step:
                ids[i] = engine.add(state(p["text"]), tv.bos, tv.eos, beam_size=p["beam"], length_penalty=p["lp"])
        for c in engine.step():
            done[c.request_id] = c
        if len(ids) == len(plan) and engine.idle:
            break
    assert engine.idle and max(engine.stats.joined_per_call) >= 1
    for i, p in enumerate(plan):
        got = done[ids[i]]
        assert got.error is None
        alone = search_batch(model.step, state(p["text"]), tv.bos, tv.eos, p["beam"], 12, policy="pool",
                             length_penalty=p["lp"])[0]  # fmt: skip
        assert [h.tokens for h in got.hypotheses] == [h.tokens for h in alone]
        # a joined row goes through matrix products of another row count: float32 noise only
        np.testing.assert_allclose([h.logprob for h in got.hypotheses], [h.logprob for h in alone], atol=1e-5)


def test_states_are_numpy_and_memory_is_shared():
    from beamkit import Shared, select_state

    for name in MODELS:
        model = load_model(name, backend="numpy")
        state = model.init_state(*_inputs(model, ["3rd of March 1999", "1/2/03"]))
        memory = state.memory if name == "dates-seq2seq" else state.cross
        assert isinstance(memory, Shared)
        logits, state = model.step(state, np.array([1, 1]))
        assert isinstance(logits, np.ndarray) and logits.shape == (2, len(model.tgt_vocab))
        picked = select_state(state, np.array([1, 1, 0]))
        assert picked.req.tolist() == [1, 1, 0]
        assert (picked.memory if name == "dates-seq2seq" else picked.cross) is memory  # never copied by beam


def test_fusion_with_an_lm_works_on_numpy():
    from beamkit import NGramLM

    lm = NGramLM(dates.lm_corpus()[:2000], dates.lm_vocab(), order=3)
    model = load_model("dates-seq2seq", backend="numpy")
    texts = ["3rd of March 1999", "march 3, '99"]
    alone = translate(model, texts, beam_size=3)
    fused0 = translate(model, texts, beam_size=3, lm=lm, lm_weight=0.0)
    assert [h.tokens for h in fused0[0]] == [h.tokens for h in alone[0]]
    fused = translate(model, texts, beam_size=3, lm=lm, lm_weight=0.5)
    assert all(len(r) == 3 for r in fused)
    try:
        torch_model = load_model("dates-seq2seq", backend="torch")
    except ImportError:
        return
    want = translate(torch_model, texts, beam_size=3, lm=lm, lm_weight=0.5)
    assert [[h.tokens for h in r] for r in fused] == [[h.tokens for h in r] for r in want]


def test_backend_errors(monkeypatch):
    with pytest.raises(ValueError, match="unknown backend 'jax'"):
        load_model("dates-seq2seq", backend="jax")
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    with pytest.raises(ImportError, match=r'pip install "\.\[models\]"'):
        load_model("dates-seq2seq", backend="torch")
    assert load_model("dates-seq2seq").backend == "numpy"  # auto falls back


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c["hparams"].update(hidden="64"), "hidden must be an integer >= 1, got '64'"),
        (lambda c: c["hparams"].update(extra=3), "bad hyper-parameters for seq2seq: unknown ['extra']"),
        (lambda c: c.update(arch="rnn"), "unknown architecture 'rnn'"),
        (lambda c: c.update(version=2), "has version 2"),
        (lambda c: c["meta"].update(max_len=0), "meta.max_len must be an integer >= 1"),
    ],
)
def test_config_errors_are_the_same_for_both_backends(tmp_path, edit, message):
    import shutil

    folder = tmp_path / "ck"
    shutil.copytree(resolve_model("dates-seq2seq"), folder)
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as numpy_error:
        load_model(folder, backend="numpy")
    assert message in str(numpy_error.value)
    _torch()
    with pytest.raises(ValueError) as torch_error:
        load_model(folder, backend="torch")
    assert str(numpy_error.value) == str(torch_error.value)


def test_corrupt_or_mismatched_weights_fail_clearly(tmp_path):
    import shutil

    folder = tmp_path / "ck"
    shutil.copytree(resolve_model("dates-seq2seq"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["hparams"]["hidden"] = 32
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="weights do not match its config"):
        load_model(folder, backend="numpy")
    (folder / "model.safetensors").write_bytes(b"\x00garbage, not safetensors")
    with pytest.raises(ValueError, match="corrupt checkpoint file .*model.safetensors"):
        load_model(folder, backend="numpy")
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_model(folder, backend="numpy")


# ------------------------------------------------------------------------------------------ command line
def test_cli_translate_numpy_equals_torch(capsys):
    from beamkit.cli import main

    _torch()
    outputs = {}
    for backend in ("numpy", "torch"):
        args = ["translate", "--backend", backend, "--beam", "5", "--quiet", "3rd of March 1999", "03/04/99"]
        assert main(args) == 0
        outputs[backend] = capsys.readouterr().out
    assert "1999-03-03" in outputs["numpy"]
    assert outputs["numpy"] == outputs["torch"]


BLOCK_TORCH = """
import sys

class BlockTorch:
    attempts = []

    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch.") or name == "safetensors":
            BlockTorch.attempts.append(name)
            raise ImportError(f"No module named {name!r} (blocked by the test)")
        return None

sys.meta_path.insert(0, BlockTorch())
from beamkit.cli import main

rc = main(sys.argv[1:])
print("ATTEMPTS", ",".join(BlockTorch.attempts), file=sys.stderr)
assert "torch" not in sys.modules
sys.exit(rc)
"""


def _run_without_torch(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(BLOCK_TORCH), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_translate_runs_without_torch():
    done = _run_without_torch("translate", "--beam", "5", "--quiet", "3rd of March 1999")
    assert done.returncode == 0, done.stderr
    assert "1. 1999-03-03" in done.stdout
    assert "ATTEMPTS torch" in done.stderr or "ATTEMPTS safetensors" in done.stderr  # auto tried, fell back
    explicit = _run_without_torch("translate", "--backend", "numpy", "--quiet", "3rd of March 1999")
    assert explicit.returncode == 0, explicit.stderr
    assert "ATTEMPTS \n" in explicit.stderr  # the numpy backend never even tries to import torch
    assert explicit.stdout == done.stdout
    refused = _run_without_torch("translate", "--backend", "torch", "--quiet", "3rd of March 1999")
    assert refused.returncode == 2 and 'pip install ".[models]"' in refused.stderr


def test_models_and_eval_run_without_torch():
    listed = _run_without_torch("models")
    assert listed.returncode == 0, listed.stderr
    assert "dates-seq2seq (default)" in listed.stdout and "dates-transformer" in listed.stdout
    ev = _run_without_torch("eval", "dates", "--beams", "1,2", "--limit", "40", "--json", "--quiet")
    assert ev.returncode == 0, ev.stderr
    assert json.loads(ev.stdout)["n"] == 40


def test_demo_and_corpus_decoding_run_without_torch(tmp_path):
    demo = _run_without_torch("demo")
    assert demo.returncode == 0, demo.stderr
    assert "b eos" in demo.stdout
    src = tmp_path / "dates.txt"
    src.write_text("3rd of March 1999\n03/04/99\n")
    out = tmp_path / "out.jsonl"
    done = _run_without_torch("decode", "--model", "dates-seq2seq", "--input", str(src), "--output", str(out))
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["n_best"][0]["text"] for r in records] == translated(["3rd of March 1999", "03/04/99"])


def translated(texts: list[str]) -> list[str]:
    """The best output of ``beamkit translate --backend numpy --json`` for each text, run in this process."""
    from beamkit.models import load_model

    model = load_model("dates-seq2seq", backend="numpy")
    return [out[0].text for out in translate(model, texts, beam_size=5)]


def test_importing_beamkit_does_not_import_torch():
    code = "import sys, beamkit, beamkit.cli, beamkit.demo, beamkit.models, beamkit.cli.tasks; "
    code += "from beamkit.models import numpy_seq2seq, numpy_transformer, weights, checkpoint; "
    code += "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'safetensors')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
