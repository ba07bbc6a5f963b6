"""Benchmark: Hugging Face ``model.generate``, ``beamkit.hf.generate`` and CTranslate2 side by side.

One process, the systems interleaved in rotating order (each runs first, second, ... equally often), torch and
CTranslate2 on one thread (``--threads``), float32, random models built offline with a fixed seed:

* ``tiny``: GPT-2, 2 layers x 64, 4 heads, vocab 1000;
* ``gpt2-small``: GPT-2-small size, 12 layers x 768, 12 heads, vocab 8000;
* ``marian``: Marian size, 6+6 layers x 512, 8 heads, FFN 2048, vocab 8000.

8 prompts of 16 tokens (some left-padded), 32 new tokens at fixed length (``min_new_tokens`` =
``max_new_tokens``; CTranslate2's ``min_length`` = ``max_length``), beam 4 and greedy. CTranslate2 runs a
converted copy of the same model (``TransformersConverter``, float32 weights; ``--int8`` adds the same
model loaded with ``compute_type="int8"``, and beamkit's int8 copy of the model, ``beamkit.hf.quantize_int8``:
int8 linear layers, the output projection included, as CTranslate2's). Each timed call records process CPU
time and wall time.

Outputs: beamkit's sequences must be tensor-equal to Hugging Face's on every run (the bench stops otherwise);
CTranslate2's best output is compared with Hugging Face's row by row and the count of equal rows printed
(CTranslate2 is its own float32 implementation: it may differ at near-ties). With ``--int8``, beamkit's int8
rows are counted against beamkit's float32 rows (equal to Hugging Face's): int8's top-1 agreement with
float32; and against the int8 model's own ``generate`` (run once, untimed; ``beamkit-int8 = hf-int8``): the
same int8 model decoded by Hugging Face, which can differ at near-ties (the paged cache's attention rounds
float32 differently from Hugging Face's, and int8 can turn a one-ulp difference into one rounding step of an
activation). Per model and mode it prints::

    [gpt2-small/beam4] wall ms (cpu ms): hf 9800 (9790), beamkit 7200 (7190), ct2 5400 (5390); ...
    hf-speedup[gpt2-small/beam4]: 1.36x; target >= 1.5x: missed
    bk-vs-ct2[gpt2-small/beam4]: 0.75x; target >= 1.0x: missed

``hf-speedup`` is Hugging Face's time over beamkit's, ``bk-vs-ct2`` CTranslate2's time over beamkit's (above
1: beamkit is faster), both on process CPU time (wall time printed beside it). With ``--int8``:
``ct2-int8-vs-bk`` is CTranslate2 int8's time over beamkit float32's, ``bk-int8-vs-ct2-int8`` CTranslate2
int8's time over beamkit int8's (above 1: beamkit's int8 is faster) and ``bk-int8-speedup`` beamkit float32's
time over its int8's; no target is set for int8. beamkit's int8 runs on the CPU only (no column with
``--device cuda``). ``forward share`` is the share of beamkit's time spent inside the model's forward calls:
where the time goes. Without ``ctranslate2`` installed the CTranslate2 columns are skipped with a note.

``--compile [backend]`` adds ``beamkit-compiled``: ``beamkit.hf.generate(..., compile=backend)`` (inductor by
default), its graphs compiled in the untimed warm-up (the first call's time is printed).
Its rows are counted against Hugging Face's (its attention sums run over padded columns and the backend may
reorder float32 sums, so it may differ at near-ties), and ``bk-compiled-speedup`` is beamkit eager's time over
the compiled one's; ``hf-speedup-compiled`` and ``bk-vs-ct2-compiled`` are the same targets as above with the
compiled time, tallied apart (``targets met with compile=...``). ``--compile max-autotune`` is inductor with its
matrix products autotuned and the weights frozen into the graphs (see ``beamkit.hf.generate``).

``--device cuda`` runs all three on a GPU (figures then on wall time; ``make gpu-check`` runs it).

Run: ``python bench/vs_ct2.py [--models tiny,gpt2-small,marian] [--modes beam,greedy] [--repeats 5] [--int8]
[--compile [backend]] [--device cuda]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

import beamkit.hf as bh  # noqa: E402

PROMPTS, PROMPT_LEN, NEW, BEAMS = 8, 16, 32, 4


def _load_sibling(name: str) -> Any:
    """The module of ``bench/NAME.py`` beside this script (the bench folder is no package)."""
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HF_BENCH = _load_sibling("hf_vs_beamkit")  # its model builders
MODELS = ("tiny", "gpt2-small", "marian")
MODES = {"beam": BEAMS, "greedy": 1}
# targets, float32 (process CPU time ratios); the CTranslate2 target depends on the model's size
HF_TARGET = 1.5  # beamkit >= 1.5x Hugging Face's speed, every model and mode
CT2_TARGET = {"tiny": 0.5, "gpt2-small": 1.0, "marian": 1.0}  # beamkit's speed over CTranslate2's
ROWS_TARGET = 7  # rows equal to Hugging Face's on >= 7 of 8 prompts


class Timings:
    """Process CPU and wall seconds of each timed call of one system."""

    def __init__(self) -> None:
        self.cpu: list[float] = []
        self.wall: list[float] = []

    def median_cpu(self) -> float:
        """Median process CPU seconds."""
        return statistics.median(self.cpu)

    def median_wall(self) -> float:
        """Median wall seconds."""
        return statistics.median(self.wall)


def rotation(i: int, sides: Sequence[str]) -> tuple[str, ...]:
    """The order of run ``i``: ``sides`` rotated by ``i`` places (each side in each position equally often)."""
    k = i % len(sides)
    return tuple(sides[k:]) + tuple(sides[:k])


def verdict(model: str, hf_speedup: float, ct2_speedup: float | None) -> list[tuple[str, float, float, bool]]:
    """The targets of one model and mode: (name, figure, target, met) for beamkit over Hugging Face and, when
    CTranslate2 ran, beamkit's speed over CTranslate2's (``ct2_speedup`` = CTranslate2's time / beamkit's)."""
    out = [("hf-speedup", hf_speedup, HF_TARGET, hf_speedup >= HF_TARGET)]
    if ct2_speedup is not None:
        target = CT2_TARGET[model]
        out.append(("bk-vs-ct2", ct2_speedup, target, ct2_speedup >= target))
    return out


def rows_equal(ours: Sequence[Sequence[int]], theirs: Sequence[Sequence[int]]) -> int:
    """How many rows of ``ours`` equal the same row of ``theirs``, token for token."""
    if len(ours) != len(theirs):
        raise ValueError(f"{len(ours)} rows against {len(theirs)}")
    return sum(list(a) == list(b) for a, b in zip(ours, theirs, strict=True))


def build(kind: str) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """(model, input_ids, attention_mask) for ``kind`` in :data:`MODELS`, seed 0, eval mode."""
    torch.manual_seed(0)
    if kind == "marian":
        vocab = 8000
        model: Any = HF_BENCH.marian(vocab)  # the model of bench/hf_vs_beamkit.py's Marian preset
    else:
        layers, width, heads, vocab = (2, 64, 4, 1000) if kind == "tiny" else (12, 768, 12, 8000)
        cfg: Any = transformers.GPT2Config(
            n_layer=layers,
            n_embd=width,
            n_head=heads,
            vocab_size=vocab,
            n_positions=PROMPT_LEN + NEW + 8,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
        model = transformers.GPT2LMHeadModel(cfg)
    model.eval()
    pad = int(model.config.pad_token_id)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab - 1, (PROMPTS, PROMPT_LEN), generator=gen)
    mask = torch.ones_like(ids)
    for i in range(PROMPTS):  # left padding on some prompts
        ids[i, : i % 3] = pad
        mask[i, : i % 3] = 0
    return model, ids, mask


class CT2:
    """A converted CTranslate2 copy of a model (float32 weights), loaded once per compute type."""

    def __init__(
        self, kind: str, model: Any, ids: torch.Tensor, mask: torch.Tensor, tmp: str, threads: int, device: str
    ) -> None:
        import ctranslate2
        import tokenizers

        self.ct2, self.kind, self.threads, self.device = ctranslate2, kind, threads, device
        vocab, pad = int(model.config.vocab_size), int(model.config.pad_token_id)
        eos = int(model.config.eos_token_id)
        names = [f"t{i}" for i in range(vocab)]
        if kind == "marian":  # CTranslate2's Marian loader expects "<pad>" at the last id (the decoder start)
            names[pad] = "<pad>"
        self.names = names
        words = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(names)}, unk_token="t3"))
        tokenizer = transformers.PreTrainedTokenizerFast(
            tokenizer_object=words, pad_token=names[pad], eos_token=names[eos], unk_token="t3", bos_token="t1"
        )
        self.eos_name = names[eos]
        self.prompts = [
            [names[t] for t, m in zip(row, keep, strict=True) if m]
            for row, keep in zip(ids.tolist(), mask.tolist(), strict=True)
        ]
        model.to("cpu").save_pretrained(tmp)
        model.to(device)
        tokenizer.save_pretrained(tmp)
        self.path = f"{tmp}/ct2"
        ctranslate2.converters.TransformersConverter(tmp).convert(self.path, quantization="float32", force=True)
        self.loaded: dict[str, Any] = {}

    def runner(self, compute_type: str, beams: int) -> Callable[[], list[list[int]]]:
        """A call decoding every prompt with ``beams`` beams at fixed length; returns the best ids per prompt."""
        if compute_type not in self.loaded:
            cls = self.ct2.Translator if self.kind == "marian" else self.ct2.Generator
            self.loaded[compute_type] = cls(
                self.path, device=self.device, compute_type=compute_type, inter_threads=1, intra_threads=self.threads
            )
        engine = self.loaded[compute_type]
        index = {w: i for i, w in enumerate(self.names)}
        if self.kind == "marian":

            def run() -> list[list[int]]:
                res = engine.translate_batch(
                    self.prompts,
                    beam_size=beams,
                    max_decoding_length=NEW,
                    min_decoding_length=NEW,
                    end_token=self.eos_name,
                )
                return [[index[t] for t in r.hypotheses[0]] for r in res]
        else:

            def run() -> list[list[int]]:
                res = engine.generate_batch(
                    self.prompts,
                    beam_size=beams,
                    max_length=NEW,
                    min_length=NEW,
                    include_prompt_in_result=False,
                    end_token=self.eos_name,
                )
                return [list(r.sequences_ids[0]) for r in res]

        return run


def new_tokens(model: Any, sequences: torch.Tensor) -> list[list[int]]:
    """The generated ids of each row of a ``generate`` output (the prompt, or Marian's decoder start, cut)."""
    start = 1 if model.config.is_encoder_decoder else PROMPT_LEN
    return [row[start:] for row in sequences.tolist()]


def run(
    kind: str, mode: str, repeats: int, threads: int, int8: bool, device: str = "cpu", compile: str | None = None
) -> list[tuple[str, float, float, bool]]:
    """Time one model in one mode on ``device``; print its line and targets; return the verdicts (on CPU time,
    or on wall time on a GPU, where the process's CPU time is not the cost)."""
    model, ids, mask = build(kind)
    model, ids, mask = model.to(device), ids.to(device), mask.to(device)
    beams = MODES[mode]
    eos, pad = int(model.config.eos_token_id), int(model.config.pad_token_id)
    beam_only = dict(early_stopping=False, length_penalty=1.0) if beams > 1 else {}
    kw = dict(num_beams=beams, max_new_tokens=NEW, min_new_tokens=NEW, eos_token_id=eos, pad_token_id=pad)
    kw.update(beam_only)
    label = f"{kind}/{mode}"
    calls: dict[str, Callable[[], Any]] = {
        "hf": lambda: model.generate(ids, attention_mask=mask, do_sample=False, **kw),
        "beamkit": lambda: bh.generate(model, ids, mask, return_dict_in_generate=True, **kw),
    }
    notes: list[str] = []
    int8_model = None
    if int8 and device == "cpu":
        int8_model = bh.quantize_int8(model)
        calls["beamkit-int8"] = lambda: bh.generate(int8_model, ids, mask, return_dict_in_generate=True, **kw)
    elif int8:
        notes.append("beamkit's int8 runs on the CPU only: no beamkit-int8 column")
    if compile:
        calls["beamkit-compiled"] = lambda: bh.generate(model, ids, mask, compile=compile, **kw)
    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        try:
            ct2 = CT2(kind, model, ids, mask, tmp, threads, device)
        except ImportError:
            ct2 = None
            notes.append("ctranslate2 not installed (pip install ctranslate2): no CTranslate2 columns")
        if ct2 is not None:
            calls["ct2"] = ct2.runner("float32", beams)
            if int8:
                calls["ct2-int8"] = ct2.runner("int8", beams)
        # warm-up and the reference outputs (the compiled step compiles its graphs here)
        hf_rows = new_tokens(model, calls["hf"]())
        outputs = {}
        for name, call in calls.items():
            if name != "hf":
                w0 = time.perf_counter()
                outputs[name] = call()
                if name == "beamkit-compiled":
                    notes.append(f"first beamkit-compiled call (compiling included): {time.perf_counter() - w0:.1f} s")
        int8_own: list[list[int]] = []
        if int8_model is not None:  # the int8 model's own generate, once (untimed): the int8 reference
            outputs["beamkit-int8"] = outputs["beamkit-int8"].sequences
            int8_own = new_tokens(model, int8_model.generate(ids, attention_mask=mask, do_sample=False, **kw))
        forward_share = []
        times = {name: Timings() for name in calls}
        for i in range(repeats):
            for name in rotation(i, list(calls)):
                c0, w0 = time.process_time(), time.perf_counter()
                out = calls[name]()
                if device != "cpu":
                    torch.cuda.synchronize()
                wall = time.perf_counter() - w0
                times[name].cpu.append(time.process_time() - c0)
                times[name].wall.append(wall)
                if name == "hf":
                    got = new_tokens(model, out)
                    if got != hf_rows:
                        raise SystemExit(f"[{label}] Hugging Face's outputs changed between runs")
                elif name == "beamkit-int8":
                    outputs[name] = out.sequences
                elif name == "beamkit":
                    outputs[name] = out
                    forward_share.append(out.forward_seconds / wall)
                    if new_tokens(model, out.sequences) != hf_rows:
                        raise SystemExit(f"[{label}] beamkit's outputs differ from Hugging Face's in run {i}")
                else:
                    outputs[name] = out
    bk = outputs["beamkit"]
    if new_tokens(model, bk.sequences) != hf_rows:
        raise SystemExit(f"[{label}] beamkit's outputs differ from Hugging Face's")
    if any(len(r) != NEW for r in hf_rows):
        raise SystemExit(f"[{label}] not fixed length: {[len(r) for r in hf_rows]}")
    parts = [f"{name} {t.median_wall() * 1e3:.0f} ({t.median_cpu() * 1e3:.0f})" for name, t in times.items()]
    agree = [f"beamkit {rows_equal(new_tokens(model, bk.sequences), hf_rows)}/{PROMPTS}"]
    for name in ("ct2", "ct2-int8"):
        if name in outputs:
            agree.append(f"{name} {rows_equal(outputs[name], hf_rows)}/{PROMPTS}")
    if "beamkit-compiled" in outputs:  # may differ from Hugging Face's at near-ties (float32 sums reordered)
        compiled_rows = new_tokens(model, outputs["beamkit-compiled"])
        agree.append(f"beamkit-compiled {rows_equal(compiled_rows, hf_rows)}/{PROMPTS}")
    if "beamkit-int8" in outputs:  # beamkit's float32 rows are Hugging Face's (checked above)
        int8_rows = new_tokens(model, outputs["beamkit-int8"])
        agree.append(f"beamkit-int8 {rows_equal(int8_rows, hf_rows)}/{PROMPTS}")
        agree.append(f"beamkit-int8 = hf-int8 {rows_equal(int8_rows, int8_own)}/{PROMPTS}")
    print(
        f"[{label}] wall ms (cpu ms), median of {repeats}: {', '.join(parts)}; rows equal to Hugging Face's: "
        f"{', '.join(agree)}; beamkit forward share {statistics.median(forward_share) * 100:.1f}%"
    )
    for note in notes:
        print(f"[{label}] {note}")
    cost = Timings.median_cpu if device == "cpu" else Timings.median_wall
    bk_cost = cost(times["beamkit"])
    hf_speedup = cost(times["hf"]) / bk_cost
    ct2_speedup = cost(times["ct2"]) / bk_cost if "ct2" in times else None
    if "ct2-int8" in times:
        print(f"ct2-int8-vs-bk[{label}]: {cost(times['ct2-int8']) / bk_cost:.2f}x (beamkit float32)")
    if "beamkit-int8" in times:
        bk_int8_cost = cost(times["beamkit-int8"])
        if "ct2-int8" in times:
            print(f"bk-int8-vs-ct2-int8[{label}]: {cost(times['ct2-int8']) / bk_int8_cost:.2f}x (no target)")
        print(f"bk-int8-speedup[{label}]: {bk_cost / bk_int8_cost:.2f}x (beamkit float32's time over int8's)")
    if "ct2" in outputs and rows_equal(outputs["ct2"], hf_rows) < ROWS_TARGET:
        print(f"[{label}] CTranslate2's rows equal Hugging Face's on fewer than {ROWS_TARGET} of {PROMPTS}")
    results = verdict(kind, hf_speedup, ct2_speedup)
    if "beamkit-compiled" in times:  # the same targets, for beamkit with compile= (named apart)
        compiled_cost = cost(times["beamkit-compiled"])
        print(f"bk-compiled-speedup[{label}]: {bk_cost / compiled_cost:.2f}x (beamkit eager's time over compiled's)")
        ct2_compiled = cost(times["ct2"]) / compiled_cost if "ct2" in times else None
        results += [
            (f"{name}-compiled", figure, target, met)
            for name, figure, target, met in verdict(kind, cost(times["hf"]) / compiled_cost, ct2_compiled)
        ]
    for name, figure, target, met in results:
        print(f"{name}[{label}]: {figure:.2f}x; target >= {target}x: {'met' if met else 'missed'}")
    return results


def main(argv: Sequence[str] | None = None) -> None:
    """Run the chosen models and modes and print the figures with their targets."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"any of {', '.join(MODELS)} (comma-separated)")
    parser.add_argument("--modes", default="beam,greedy", help="beam (4 beams) and/or greedy")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch and CTranslate2 CPU threads")
    parser.add_argument(
        "--int8", action="store_true", help="add CTranslate2 int8 (compute_type int8) and beamkit int8 (quantize_int8)"
    )
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where all three systems run")
    parser.add_argument(
        "--compile",
        nargs="?",
        const="inductor",
        default=None,
        help="add beamkit with its compiled decoding step (a torch.compile backend; default inductor)",
    )
    args = parser.parse_args(argv)
    models, modes = args.models.split(","), args.modes.split(",")
    for name in models:
        if name not in MODELS:
            parser.error(f"unknown model {name!r}: choose from {', '.join(MODELS)}")
    for name in modes:
        if name not in MODES:
            parser.error(f"unknown mode {name!r}: choose from {', '.join(MODES)}")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()  # the converter's save / load bars
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, threads {torch.get_num_threads()}")
    summary = [
        r
        for kind in models
        for mode in modes
        for r in run(kind, mode, args.repeats, args.threads, args.int8, args.device, args.compile)
    ]
    eager = [m for name, *_, m in summary if not name.endswith("-compiled")]
    print(f"targets met: {sum(eager)} of {len(eager)}")
    compiled = [m for name, *_, m in summary if name.endswith("-compiled")]
    if compiled:
        print(f"targets met with compile={args.compile}: {sum(compiled)} of {len(compiled)}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
