"""Benchmark: beamkit's search over an OpenVINO IR against OpenVINO GenAI's ``LLMPipeline`` and
``ContinuousBatchingPipeline`` on the same IR, and Hugging Face ``model.generate``.

One process, the systems interleaved in rotating order (each runs first, second, ... equally often), one thread
each (``--threads``: torch's threads, OpenVINO's ``INFERENCE_NUM_THREADS``), random GPT-2 models built offline
with a fixed seed (``bench/vs_ct2.py``'s builders):

* ``tiny``: GPT-2, 2 layers x 64, 4 heads, vocab 1000;
* ``gpt2-small``: GPT-2-small size, 12 layers x 768, 12 heads, vocab 8000;
* ``marian``: Marian size, 6+6 layers x 512, 8 heads, FFN 2048, vocab 8000 (encoder-decoder: exported with
  :func:`beamkit.openvino.export_seq2seq` and compared with CTranslate2 on a converted copy, ``bench/vs_ct2.py``'s,
  float32 only; ``vs-ct2`` is CTranslate2's CPU time over beamkit's, target >= 1.0x).

8 prompts of 16 tokens (some left-padded), 32 new tokens at fixed length (``min_new_tokens`` =
``max_new_tokens``), beam 4 and greedy. The model is exported once with :func:`beamkit.openvino.export_decoder`
(stateful, ``beam_idx``), and both OpenVINO sides read that folder. Two precisions:

* ``f32``: beamkit ``precision="f32"``; GenAI with ``INFERENCE_PRECISION_HINT=f32``, ``KV_CACHE_PRECISION=f32``
  (both: float32 inference and cache);
* ``default``: each side's CPU default (beamkit ``precision="auto"``; GenAI with no precision property).

Columns: ``hf`` (float32 torch), ``bk-ov`` (``beamkit.openvino.generate``), ``genai`` (``LLMPipeline.generate``
on the prompts' ids and mask), ``genai-cb`` (``ContinuousBatchingPipeline.generate``: each prompt, its padding
stripped, a request of its paged-attention scheduler; 1 GB of key/value blocks, its other scheduler defaults).
Each timed call records process CPU time and wall time. Per model, mode and precision it prints::

    [gpt2-small/beam4/f32] cpu ms (wall ms): hf 9800 (9790), bk-ov 5400 (5390), genai 5300 (5290); rows = hf: ...
    vs-genai[gpt2-small/beam4/f32]: 0.98x; target >= 0.95x: met
    vs-hf[gpt2-small/beam4/f32]: 1.81x; target >= 1.5x: met

``vs-genai`` / ``vs-genai-cb`` is that GenAI pipeline's CPU time over beamkit's (above 1: beamkit is faster),
``vs-hf`` Hugging Face's over beamkit's (float32 only). ``rows = hf`` counts rows equal to Hugging Face's best,
token for token, for every OpenVINO side (the target: >= 7 of 8 at float32; not set at the default precision).
``forward share`` is the share of beamkit's time spent inside OpenVINO's inference calls: where the rest of the
time goes (the search, the processors, Python).

Run: ``python bench/vs_openvino.py [--models tiny,gpt2-small,marian] [--modes beam,greedy]
[--precisions f32,default] [--repeats 3] [--threads 1]``. Needs ``openvino``, ``openvino-genai``, torch and
transformers (and ``ctranslate2`` for ``marian``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import beamkit.openvino as bo  # noqa: E402


def _load_sibling(name: str) -> Any:
    """The module of ``bench/NAME.py`` beside this script (the bench folder is no package)."""
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


VS_CT2 = _load_sibling("vs_ct2")  # build(): the same random models and prompts
NEW, PROMPT_LEN = VS_CT2.NEW, VS_CT2.PROMPT_LEN
MODELS = ("tiny", "gpt2-small", "marian")
MODES = {"beam": 4, "greedy": 1}
PRECISIONS = ("f32", "default")
GENAI_TARGET = {"tiny": 0.5, "gpt2-small": 0.95}  # beamkit's speed over GenAI's
CT2_TARGET = 1.0  # beamkit's speed over CTranslate2's (Marian, float32)
HF_TARGET = 1.5  # beamkit's speed over Hugging Face's (float32)
ROWS_TARGET = 7  # rows equal to Hugging Face's on >= 7 of 8 prompts (float32)


def genai_runner(folder: Path, precision: str, threads: int, beams: int, ids: Any, mask: Any, eos: int) -> Any:
    """A call of GenAI's ``LLMPipeline`` on the IR folder: every prompt at once, ``beams`` beams at fixed length;
    returns the best new ids per prompt."""
    import openvino as ov
    import openvino_genai as og

    props: dict[str, Any] = {"INFERENCE_NUM_THREADS": threads}
    if precision == "f32":
        props.update(INFERENCE_PRECISION_HINT="f32", KV_CACHE_PRECISION="f32")
    pipe = og.LLMPipeline(str(folder), "CPU", **props)
    config = pipe.get_generation_config()
    config.max_new_tokens = NEW
    config.min_new_tokens = NEW
    config.num_beams = beams
    config.num_beam_groups = 1
    config.num_return_sequences = 1
    config.diversity_penalty = 0.0
    config.length_penalty = 1.0
    config.stop_criteria = og.StopCriteria.HEURISTIC  # Hugging Face's early_stopping=False
    config.eos_token_id = eos
    config.do_sample = False
    inputs = og.TokenizedInputs(ov.Tensor(ids.numpy().astype(np.int64)), ov.Tensor(mask.numpy().astype(np.int64)))

    def run() -> list[list[int]]:
        return [list(row) for row in pipe.generate(inputs, config).tokens]

    return run


def genai_cb_runner(folder: Path, precision: str, threads: int, beams: int, ids: Any, mask: Any, eos: int) -> Any:
    """A call of GenAI's ``ContinuousBatchingPipeline`` (its paged-attention scheduler: the IR's attention turned
    into paged attention, prompts batched together) on the IR folder: every prompt (its padding stripped) as a
    request, ``beams`` beams at fixed length; returns the best new ids per prompt."""
    import openvino as ov
    import openvino_genai as og

    props: dict[str, Any] = {"INFERENCE_NUM_THREADS": threads}
    if precision == "f32":
        props.update(INFERENCE_PRECISION_HINT="f32", KV_CACHE_PRECISION="f32")
    scheduler = og.SchedulerConfig()
    scheduler.cache_size = 1  # GB of key/value blocks
    pipe = og.ContinuousBatchingPipeline(str(folder), scheduler, "CPU", props)
    config = og.GenerationConfig()
    config.max_new_tokens = NEW
    config.min_new_tokens = NEW
    config.num_beams = beams
    config.num_beam_groups = 1
    config.num_return_sequences = 1
    config.diversity_penalty = 0.0
    config.length_penalty = 1.0
    config.stop_criteria = og.StopCriteria.HEURISTIC  # Hugging Face's early_stopping=False
    config.eos_token_id = eos
    config.do_sample = False
    prompts = [
        ov.Tensor(row[keep.bool()].numpy().astype(np.int64)[None]) for row, keep in zip(ids, mask, strict=True)
    ]  # each: (1, its length)

    def run() -> list[list[int]]:
        return [list(r.m_generation_ids[0]) for r in pipe.generate(prompts, [config] * len(prompts))]

    return run


def run(kind: str, mode: str, precision: str, repeats: int, threads: int, folder: Path, model: Any, ids: Any,
        mask: Any) -> list[tuple[str, float, float, bool]]:  # fmt: skip
    """Time one model, mode and precision; print its line and targets; return the verdicts."""
    beams = MODES[mode]
    eos, pad = int(model.config.eos_token_id), int(model.config.pad_token_id)
    kw: dict[str, Any] = dict(num_beams=beams, max_new_tokens=NEW, min_new_tokens=NEW, eos_token_id=eos,
                              pad_token_id=pad)  # fmt: skip
    if beams > 1:
        kw.update(early_stopping=False, length_penalty=1.0)
    ov_model = bo.Model(folder)
    ours = "f32" if precision == "f32" else "auto"
    forward: list[float] = []

    def bk() -> list[list[int]]:
        out = bo.generate(ov_model, ids, mask, precision=ours, threads=threads, return_dict_in_generate=True, **kw)
        forward.append(out.forward_seconds)
        return [row[PROMPT_LEN:] for row in out.sequences.tolist()]

    calls: dict[str, Callable[[], list[list[int]]]] = {
        "hf": lambda: [
            r[PROMPT_LEN:] for r in model.generate(ids, attention_mask=mask, do_sample=False, **kw).tolist()
        ],
        "bk-ov": bk,
        "genai": genai_runner(folder, precision, threads, beams, ids, mask, eos),
        "genai-cb": genai_cb_runner(folder, precision, threads, beams, ids, mask, eos),
    }
    if precision != "f32":
        calls.pop("hf")  # Hugging Face's rows are the float32 reference: computed once, untimed
    reference = [r[PROMPT_LEN:] for r in model.generate(ids, attention_mask=mask, do_sample=False, **kw).tolist()]
    targets = {
        "genai": GENAI_TARGET[kind],
        "genai-cb": GENAI_TARGET[kind],
        **({"hf": HF_TARGET} if "hf" in calls else {}),
    }
    # the rows are compared with Hugging Face's float32 ones as a target at float32 only (counted at every precision)
    return _timed(f"{kind}/{mode}/{precision}", calls, reference, repeats, forward, targets, precision == "f32")


def run_seq2seq(mode: str, repeats: int, threads: int, folder: Path, model: Any, ids: Any, mask: Any,
                tmp: str) -> list[tuple[str, float, float, bool]]:  # fmt: skip
    """Time the Marian model in one mode, float32: Hugging Face, beamkit over the IR, CTranslate2 (a converted
    copy, ``bench/vs_ct2.py``'s); print its line and targets; return the verdicts."""
    beams = MODES[mode]
    kw: dict[str, Any] = dict(num_beams=beams, max_new_tokens=NEW, min_new_tokens=NEW)
    if beams > 1:
        kw.update(early_stopping=False, length_penalty=1.0)
    ov_model = bo.Model(folder)
    forward: list[float] = []

    def bk() -> list[list[int]]:
        out = bo.generate(ov_model, ids, mask, threads=threads, return_dict_in_generate=True, **kw)
        forward.append(out.forward_seconds)
        return [row[1:] for row in out.sequences.tolist()]

    ct2 = VS_CT2.CT2("marian", model, ids, mask, tmp, threads, "cpu")
    calls: dict[str, Callable[[], list[list[int]]]] = {
        "hf": lambda: [r[1:] for r in model.generate(ids, attention_mask=mask, do_sample=False, **kw).tolist()],
        "bk-ov": bk,
        "ct2": ct2.runner("float32", beams),
    }
    reference = calls["hf"]()
    return _timed(f"marian/{mode}/f32", calls, reference, repeats, forward, {"ct2": CT2_TARGET, "hf": HF_TARGET})


def _timed(label: str, calls: dict[str, Any], reference: list[list[int]], repeats: int, forward: list[float],
           targets: dict[str, float], rows_target: bool = True) -> list[tuple[str, float, float, bool]]:  # fmt: skip
    """Warm every call up, time them interleaved in rotating order, print the line and the targets (each peer's
    CPU time over beamkit's, ``targets`` by peer; with ``rows_target``, beamkit's rows equal to ``reference``)
    and return the verdicts."""
    for call in calls.values():
        call()
    cpu: dict[str, list[float]] = {name: [] for name in calls}
    wall: dict[str, list[float]] = {name: [] for name in calls}
    rows: dict[str, int] = {}
    forward.clear()
    spent: list[float] = []
    names = list(calls)
    for i in range(repeats):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            c0, w0 = time.process_time(), time.perf_counter()
            got = calls[name]()
            cpu[name].append(time.process_time() - c0)
            wall[name].append(time.perf_counter() - w0)
            if name == "bk-ov":
                spent.append(wall[name][-1])
            rows[name] = sum(list(a) == list(b) for a, b in zip(got, reference, strict=True))
    med = {name: statistics.median(cpu[name]) for name in calls}
    medw = {name: statistics.median(wall[name]) for name in calls}
    times = ", ".join(f"{n} {1000 * med[n]:.0f} ({1000 * medw[n]:.0f})" for n in calls)
    equal = ", ".join(f"{n} {rows[n]}/{len(reference)}" for n in calls if n != "hf")
    share = sum(forward) / sum(spent) if spent else float("nan")
    print(f"[{label}] cpu ms (wall ms): {times}; rows = hf: {equal}; bk-ov forward share {share:.0%}")
    verdicts = []
    for peer, target in targets.items():
        ratio = med[peer] / med["bk-ov"]
        verdicts.append((f"vs-{peer}[{label}]", ratio, target, ratio >= target))
    if rows_target:
        verdicts.append((f"rows[{label}]", rows["bk-ov"], ROWS_TARGET, rows["bk-ov"] >= ROWS_TARGET))
    for name, figure, target, met in verdicts:
        shown = f"{figure:.2f}x" if isinstance(figure, float) else f"{figure}/{len(reference)}"
        unit = "x" if isinstance(figure, float) else ""
        print(f"{name}: {shown}; target >= {target}{unit}: {'met' if met else 'missed'}")
    sys.stdout.flush()
    return verdicts


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print every line and a summary of targets met."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"load: {os.getloadavg()}; openvino {__import__('openvino').__version__}; torch {torch.__version__}")
    verdicts = []
    for kind in args.models.split(","):
        model, ids, mask = VS_CT2.build(kind)
        if kind == "marian":
            with tempfile.TemporaryDirectory() as tmp:
                folder = bo.export_seq2seq(model, Path(tmp) / "ir")
                for mode in args.modes.split(","):
                    verdicts += run_seq2seq(mode, args.repeats, args.threads, folder, model, ids, mask, tmp)
            continue
        with tempfile.TemporaryDirectory() as tmp:
            folder = bo.export_decoder(model, Path(tmp) / "ir")
            for mode in args.modes.split(","):
                for precision in args.precisions.split(","):
                    verdicts += run(kind, mode, precision, args.repeats, args.threads, folder, model, ids, mask)
    met = sum(v[3] for v in verdicts)
    print(f"targets met: {met}/{len(verdicts)}; load: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
