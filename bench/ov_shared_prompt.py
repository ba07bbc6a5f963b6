"""Benchmark: wide beams over one long prompt on OpenVINO, the usual stateful IR (every beam holds its own copy of
the prompt's keys/values) against beamkit's shared-prompt IR (``generate(..., shared_prompt=True)``: the prompt's
keys/values held once per request), and GenAI's ``ContinuousBatchingPipeline`` on the usual IR (its beams share the
prompt's key/value blocks).

A random GPT-2-small-size model (12 layers x 768, 12 heads, vocabulary 8000, seed 0), one prompt of ``--prompt``
tokens (default 256), ``--new`` new tokens at fixed length (default 16), beams ``--widths`` (default 16,64), float32,
one thread. Per width it prints::

    [w64] cpu ms (wall ms): dense 5300 (5400), shared 3100 (3200), genai-cb 4000 (4100); same tokens as dense:
    shared yes, genai-cb yes; state MB dense 1220 / shared 86; peak RSS growth MB dense 1349 / shared 416 / ...
    speed[w64] shared vs dense: 1.72x
    speed[w64] shared vs genai-cb: 1.30x

``speed``: the other's CPU time over the shared IR's (interleaved in rotating order in one process, median of
``--repeats``). ``state MB``: the most bytes of keys/values beamkit's model holds after a call (dense: every row's
prompt and generated positions; shared: the prompt once plus each row's generated positions), from the rows of
each call. ``peak RSS growth``: each variant decoded in a fresh process, its peak resident memory during the
measured call (sampled every 2 ms) minus its resident memory before it (model read, compiled and warmed up on the
prompt). ``same tokens``: the best row equal to the dense one's.

Run: ``python bench/ov_shared_prompt.py [--widths 16,64] [--prompt 256] [--new 16] [--repeats 2] [--no-genai]``.
Needs ``openvino``, torch and transformers (and ``openvino-genai`` unless ``--no-genai``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import beamkit.openvino as bo  # noqa: E402

LAYERS, WIDTH, HEADS, VOCAB = 12, 768, 12, 8000
PER_POSITION = LAYERS * 2 * WIDTH * 4  # bytes of one position's keys and values, float32


def build(prompt: int, new: int) -> tuple[Any, torch.Tensor]:
    """The random model and one prompt ``[1, prompt]``."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=LAYERS, n_embd=WIDTH, n_head=HEADS, vocab_size=VOCAB, n_positions=prompt + new + 8,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(3, VOCAB - 1, (1, prompt), generator=torch.Generator().manual_seed(1))
    return model, ids


def decode(model: Any, ids: torch.Tensor, width: int, new: int, shared: bool) -> Any:
    """One call at ``width`` beams, fixed length."""
    return bo.generate(
        model, ids, torch.ones_like(ids), shared_prompt=shared, precision="f32", threads=1, num_beams=width,
        max_new_tokens=new, min_new_tokens=new, early_stopping=False, length_penalty=1.0, eos_token_id=2,
        pad_token_id=0, return_dict_in_generate=True,
    )  # fmt: skip


def ours(model: Any, ids: torch.Tensor, width: int, new: int, shared: bool) -> Callable[[], list[int]]:
    """A call of :func:`decode` returning the best row's new ids."""
    return lambda: decode(model, ids, width, new, shared).sequences[0, ids.shape[1] :].tolist()


def genai_cb(folder: Path | str, ids: torch.Tensor, width: int, new: int) -> Callable[[], list[int]]:
    """GenAI's ``ContinuousBatchingPipeline`` on the folder's usual IR (float32, one thread, its key/value blocks
    grown as needed): a call returning the best row's new ids."""
    import openvino as ov
    import openvino_genai as og

    props = {"INFERENCE_NUM_THREADS": 1, "INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
    pipe = og.ContinuousBatchingPipeline(str(folder), og.SchedulerConfig(), "CPU", props)
    config = og.GenerationConfig()
    config.max_new_tokens = config.min_new_tokens = new
    config.num_beams, config.num_beam_groups, config.num_return_sequences = width, 1, 1
    config.diversity_penalty, config.length_penalty = 0.0, 1.0
    config.stop_criteria = og.StopCriteria.HEURISTIC
    config.eos_token_id, config.do_sample = 2, False
    prompt = [ov.Tensor(ids.numpy().astype(np.int64))]

    def run() -> list[int]:
        return list(pipe.generate(prompt, [config])[0].m_generation_ids[0])

    return run


def state_bytes(rows_per_call: list[int], prompt: int, shared: bool) -> int:
    """The most bytes of keys/values held after a call of one request: call 0 runs the prompt (one row), call
    ``i`` leaves ``rows_i`` rows with ``i`` generated positions."""
    peak = prompt * PER_POSITION
    for i, rows in enumerate(rows_per_call[1:], start=1):
        held = prompt + rows * i if shared else rows * (prompt + i)
        peak = max(peak, held * PER_POSITION)
    return peak


def _rss() -> int:
    """Resident bytes now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(folder: str, width: int, prompt: int, new: int, variant: str) -> None:
    """Decode in this (fresh) process: a short warm-up call (one beam, two tokens: the prompt's shapes compiled),
    then the measured call while a thread samples the resident memory every 2 ms; print the peak's growth over
    the resident memory before that call, in bytes, as JSON."""
    torch.set_num_threads(1)
    _, ids = build(prompt, new)
    if variant == "genai-cb":
        genai_cb(folder, ids, 1, 2)()
        call = genai_cb(folder, ids, width, new)
    else:
        model = bo.Model(folder)
        shared = variant == "shared"
        decode(model, ids, 1, 2, shared)

        def call() -> Any:
            return decode(model, ids, width, new, shared)

    gc.collect()
    before = _rss()
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    call()
    done.set()
    sampler.join()
    print(json.dumps({"growth": max(peak[0], _rss()) - before}))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print every line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", default="16,64")
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--new", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-genai", action="store_true", help="leave GenAI's ContinuousBatchingPipeline out")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--variant", default="dense", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, int(args.widths), args.prompt, args.new, args.variant)
        return 0
    torch.set_num_threads(1)
    print(
        f"load: {os.getloadavg()}; openvino {__import__('openvino').__version__}; prompt {args.prompt}, new {args.new}"
    )
    model, ids = build(args.prompt, args.new)
    variants = ("dense", "shared") if args.no_genai else ("dense", "shared", "genai-cb")
    with tempfile.TemporaryDirectory() as tmp:
        folder = bo.export_decoder(model, Path(tmp) / "ir", shared_prompt=True)
        ov_model = bo.Model(folder)
        for width in (int(w) for w in args.widths.split(",")):
            calls: dict[str, Callable[[], list[int]]] = {
                "dense": ours(ov_model, ids, width, args.new, False),
                "shared": ours(ov_model, ids, width, args.new, True),
            }
            if "genai-cb" in variants:
                calls["genai-cb"] = genai_cb(folder, ids, width, args.new)
            rows = {v: call() for v, call in calls.items()}  # warm-up
            cpu: dict[str, list[float]] = {v: [] for v in calls}
            wall: dict[str, list[float]] = {v: [] for v in calls}
            for i in range(args.repeats):
                k = i % len(variants)
                for v in variants[k:] + variants[:k]:
                    c0, w0 = time.process_time(), time.perf_counter()
                    rows[v] = calls[v]()
                    cpu[v].append(time.process_time() - c0)
                    wall[v].append(time.perf_counter() - w0)
            out = {s: decode(ov_model, ids, width, args.new, s) for s in (False, True)}
            held = {s: state_bytes(out[s].stats.rows_per_call, args.prompt, s) / 2**20 for s in (False, True)}
            growth = {}
            for v in variants:
                cmd = [sys.executable, __file__, "--child", str(folder), "--widths", str(width), "--prompt",
                       str(args.prompt), "--new", str(args.new), "--variant", v]  # fmt: skip
                done = subprocess.run(cmd, capture_output=True, text=True, check=True)
                growth[v] = json.loads(done.stdout.strip().splitlines()[-1])["growth"] / 2**20
            med = {v: statistics.median(cpu[v]) for v in variants}
            medw = {v: statistics.median(wall[v]) for v in variants}
            times = ", ".join(f"{v} {1000 * med[v]:.0f} ({1000 * medw[v]:.0f})" for v in variants)
            same = ", ".join(f"{v} {'yes' if rows[v] == rows['dense'] else 'no'}" for v in variants[1:])
            memory = " / ".join(f"{v} {growth[v]:.0f}" for v in variants)
            print(
                f"[w{width}] cpu ms (wall ms): {times}; same tokens as dense: {same}; state MB dense "
                f"{held[False]:.0f} / shared {held[True]:.0f}; peak RSS growth MB {memory}"
            )
            for v in variants[:1] + variants[2:]:
                print(f"speed[w{width}] shared vs {v}: {med[v] / med['shared']:.2f}x")
            sys.stdout.flush()
    print(f"load: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
