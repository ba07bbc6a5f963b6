"""Benchmark: wide beams over one long prompt on OpenVINO, the usual stateful IR (every beam holds its own copy of
the prompt's keys/values) against beamkit's shared-prompt IR (``generate(..., shared_prompt=True)``: the prompt's
keys/values held once per request).

A random GPT-2-small-size model (12 layers x 768, 12 heads, vocabulary 8000, seed 0), one prompt of ``--prompt``
tokens (default 256), ``--new`` new tokens at fixed length (default 16), beams ``--widths`` (default 16,64), float32
(``precision="f32"``), one thread. Per width it prints::

    [w64] cpu ms (wall ms): dense 9000 (9010), shared 3000 (3005); same tokens: yes; state MB dense 1282 / shared 94;
    peak RSS growth MB dense 1400 / shared 180
    speed[w64]: 3.00x

``speed`` is the dense call's CPU time over the shared one's (interleaved in one process, median of
``--repeats``). ``state MB``: the most bytes of keys/values the model holds after a call (dense: every row's
prompt and generated positions; shared: the prompt once plus each row's generated positions), from the rows of
each call. ``peak RSS growth``: each variant decoded in a fresh process, its peak resident memory during the
measured call (sampled every 2 ms) minus its resident memory before it (model read, compiled and warmed up on the
prompt). ``same tokens``: both variants' best rows equal.

Run: ``python bench/ov_shared_prompt.py [--widths 16,64] [--prompt 256] [--new 16] [--repeats 2]``. Needs
``openvino``, torch and transformers.
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
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

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


def child(folder: str, width: int, prompt: int, new: int, shared: bool) -> None:
    """Decode in this (fresh) process: a short warm-up call (one beam, two tokens: the prompt's shapes compiled),
    then the measured call while a thread samples the resident memory every 2 ms; print the peak's growth over
    the resident memory before that call, in bytes, as JSON."""
    torch.set_num_threads(1)
    _, ids = build(prompt, new)
    model = bo.Model(folder)
    decode(model, ids, 1, 2, shared)
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
    decode(model, ids, width, new, shared)
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
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--shared", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, int(args.widths), args.prompt, args.new, args.shared)
        return 0
    torch.set_num_threads(1)
    print(
        f"load: {os.getloadavg()}; openvino {__import__('openvino').__version__}; prompt {args.prompt}, new {args.new}"
    )
    model, ids = build(args.prompt, args.new)
    with tempfile.TemporaryDirectory() as tmp:
        folder = bo.export_decoder(model, Path(tmp) / "ir", shared_prompt=True)
        ov_model = bo.Model(folder)
        for width in (int(w) for w in args.widths.split(",")):
            outs = {shared: decode(ov_model, ids, width, args.new, shared) for shared in (False, True)}  # warm-up
            cpu: dict[bool, list[float]] = {False: [], True: []}
            wall: dict[bool, list[float]] = {False: [], True: []}
            for i in range(args.repeats):
                for shared in (False, True) if i % 2 == 0 else (True, False):
                    c0, w0 = time.process_time(), time.perf_counter()
                    outs[shared] = decode(ov_model, ids, width, args.new, shared)
                    cpu[shared].append(time.process_time() - c0)
                    wall[shared].append(time.perf_counter() - w0)
            same = torch.equal(outs[False].sequences, outs[True].sequences)
            held = {s: state_bytes(outs[s].stats.rows_per_call, args.prompt, s) / 2**20 for s in (False, True)}
            growth = {}
            for shared in (False, True):
                cmd = [sys.executable, __file__, "--child", str(folder), "--widths", str(width), "--prompt",
                       str(args.prompt), "--new", str(args.new)] + (["--shared"] if shared else [])  # fmt: skip
                done = subprocess.run(cmd, capture_output=True, text=True, check=True)
                growth[shared] = json.loads(done.stdout.strip().splitlines()[-1])["growth"] / 2**20
            med = {s: statistics.median(cpu[s]) for s in (False, True)}
            medw = {s: statistics.median(wall[s]) for s in (False, True)}
            print(
                f"[w{width}] cpu ms (wall ms): dense {1000 * med[False]:.0f} ({1000 * medw[False]:.0f}), shared "
                f"{1000 * med[True]:.0f} ({1000 * medw[True]:.0f}); same tokens: {'yes' if same else 'no'}; "
                f"state MB dense {held[False]:.0f} / shared {held[True]:.0f}; peak RSS growth MB dense "
                f"{growth[False]:.0f} / shared {growth[True]:.0f}"
            )
            print(f"speed[w{width}]: {med[False] / med[True]:.2f}x")
            sys.stdout.flush()
    print(f"load: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
