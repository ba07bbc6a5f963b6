"""Benchmark: peak memory (RSS) of ``beamkit.hf.generate``, ``beamkit serve hf:DIR`` and Hugging Face's own
``model.generate`` on GPT-2-style models of a few sizes, and where it goes.

Each model is built from a config (random weights, seed 0, no download) and saved with a word-level tokenizer
to a temporary folder, then every case runs in a fresh Python process (Linux: ``/proc`` is read):

* ``generate``: ``beamkit.hf.generate`` of 64 prompts of 16 tokens, 4 beams, 64 new tokens (the eos token's
  embedding row is zero, so no hypothesis ends early: every request runs all 64 steps, the worst case);
* ``serve``: the same 64 prompts sent at once (64 concurrent completions, ``best_of`` 4, ``max_tokens`` 64) to
  ``beamkit serve hf:DIR`` on a free 127.0.0.1 port, started as a subprocess and stopped (that PID only) after;
* ``hf``: Hugging Face's ``model.generate`` on the same batch, the reference.

Per case: RSS after ``import torch``, after ``import transformers`` (+ beamkit.hf), after loading the model
(``beamkit.hf.load_pretrained``, the loader ``serve`` uses), the peak (the kernel's ``VmHWM``, which is
``ru_maxrss``, and a 5 ms sampler of ``VmRSS``), and at the sampled peak glibc's ``mallinfo2``: bytes malloc
holds in use and free (retained in its heaps, not returned to the system). A forward hook reads the dense
key/value cache bytes after each model call (the most seen is "K/V at peak"). The attribution splits the peak
into: baseline (interpreter + torch + transformers + beamkit), weights (RSS the load added), K/V (dense cache
bytes at the peak call), malloc's free-but-retained bytes (fragmentation), and the rest (transient step tensors:
logits, the cache's old copy while ``torch.cat`` / the beam gather builds the new one, activations).

``serve`` also reports the server's RSS 3 s after the last answer ("idle after": ``beamkit serve`` returns
its free heap memory to the system once its engine has been idle for a second, see ``beamkit.serve.malloc``).
``--malloc`` also reruns ``generate`` and ``serve`` of the largest model under glibc settings that map every
buffer of 1 MiB or more on its own (``MALLOC_MMAP_THRESHOLD_=1048576``; and the same with transparent huge pages,
``GLIBC_TUNABLES=glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=1048576``): no retained free memory, at
the price of page faults. ``--tracemalloc`` adds one ``generate`` run of the largest model under
``tracemalloc`` (Python objects' peak: hypotheses, stats lists). Every run uses one torch thread (``--threads``).

Run: ``HF_HUB_OFFLINE=1 python bench/hf_memory.py [--sizes tiny,small,medium] [--modes generate,serve,hf]
[--malloc] [--tracemalloc]``. Prints one table (MB = 10^6 bytes) and, per case, a line such as
``peak-rss[medium/serve]: 1234 MB``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROMPTS, PROMPT_LEN, BEAMS, NEW = 64, 16, 4, 64
EOS, PAD, VOCAB = 2, 0, 8000
# name: (layers, width, heads); vocab 8000, 128 positions. float32 weights: tiny 6 MB, small 41 MB, medium 93 MB
SIZES = {"tiny": (2, 128, 4), "small": (4, 384, 6), "medium": (6, 512, 8)}
MB = 1e6


# ------------------------------------------------------------------------------------------------ probes
def status(pid: int | str = "self") -> dict[str, int]:
    """``/proc/PID/status`` memory fields in bytes (VmRSS, VmHWM, RssAnon, RssFile)."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(rest.split()[0]) * 1024
    return out


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


_LIBC: Any = None


def mallinfo() -> dict[str, int]:
    """glibc's ``mallinfo2()`` over all arenas: ``in_use`` (heap chunks in use + mmapped chunks), ``free`` (free
    chunks malloc keeps in its heaps), ``mmapped``; empty off glibc."""
    global _LIBC
    try:
        if _LIBC is None:
            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.mallinfo2.restype = _Mallinfo2
        m = _LIBC.mallinfo2()
    except (OSError, AttributeError):
        return {}
    return {"in_use": m.uordblks + m.hblkhd, "free": m.fordblks, "mmapped": m.hblkhd, "heap": m.arena}


class Sampler:
    """A thread sampling VmRSS of ``pid`` every ``period`` s; keeps the peak and, in-process, mallinfo there."""

    def __init__(self, pid: int | str = "self", period: float = 0.005, in_process: bool = True):
        self.pid, self.period, self.in_process = pid, period, in_process
        self.peak, self.at_peak, self.samples = 0, {}, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                rss = status(self.pid)["VmRSS"]
            except (OSError, KeyError):
                return
            self.samples += 1
            if rss > self.peak:
                self.peak = rss
                if self.in_process:  # mallinfo near the peak (it walks the free lists: not every sample)
                    self.at_peak = {"rss": rss, **mallinfo(), **status()}
            self._stop.wait(self.period)


class KVProbe:
    """A forward hook: the key/value bytes of the model's cache after each call (the most seen: a dense cache's
    tensors, or a paged cache's whole pool, which is resident from its creation), and the logits' bytes."""

    def __init__(self, model: Any):
        from beamkit.hf.versions import output_cache  # after the measured imports

        self.output_cache = output_cache
        self.kv_peak = 0
        self.logits_peak = 0
        self.handle = model.register_forward_hook(self._hook)

    def _hook(self, module: Any, args: Any, out: Any) -> None:
        try:
            cache = self.output_cache(out)  # `cache` from transformers 5.24 on, `past_key_values` before
        except AttributeError:  # an output without a cache
            cache = None
        total = 0
        pool = getattr(getattr(cache, "pool", None), "kv", None)  # a paged cache: its whole (zero-filled) pool
        if pool is not None:
            total = pool.n_blocks * pool.block_bytes
        for layer in getattr(cache, "layers", None) or []:
            for name in ("keys", "values"):
                t = getattr(layer, name, None)
                if t is not None:
                    total += t.numel() * t.element_size()
        self.kv_peak = max(self.kv_peak, total)
        logits = getattr(out, "logits", None)
        if logits is not None:
            self.logits_peak = max(self.logits_peak, logits.numel() * logits.element_size())


# ------------------------------------------------------------------------------------------------ models
def words(n: int, seed: int) -> list[str]:
    """``n`` fixed pseudo-random words of the tokenizer (never the special tokens)."""
    import random

    rng = random.Random(seed)
    return [f"w{rng.randrange(4, VOCAB)}" for _ in range(n)]


def prompts() -> list[str]:
    """The 64 prompts of 16 words (one token each)."""
    return [" ".join(words(PROMPT_LEN, 1000 + i)) for i in range(PROMPTS)]


def build(size: str, folder: Path) -> int:
    """Save the GPT-2-style model ``size`` and its tokenizer to ``folder``; returns its float32 weight bytes."""
    import torch
    import transformers
    from continuous_batching import save_word_tokenizer  # imported here: the workers measure their imports

    layers, width, heads = SIZES[size]
    words = ["[PAD]", "[BOS]", "[EOS]", "[UNK]", *(f"w{i}" for i in range(4, VOCAB))]  # "[PAD]" is PAD, "[EOS]" EOS
    special = {"unk_token": "[UNK]", "pad_token": "[PAD]", "bos_token": "[BOS]", "eos_token": "[EOS]"}
    save_word_tokenizer(folder, words, **special)
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=layers, n_embd=width, n_head=heads, vocab_size=VOCAB, n_positions=128, bos_token_id=1,
        eos_token_id=EOS, pad_token_id=PAD,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # eos scores 0, never among a row's best 2 x 4: every request runs all 64 steps
        model.get_output_embeddings().weight[EOS] = 0.0
    model.generation_config.eos_token_id = EOS
    model.generation_config.pad_token_id = PAD
    model.save_pretrained(folder)
    return sum(p.numel() * p.element_size() for p in model.parameters())


# ------------------------------------------------------------------------------------------------ workers
def worker(mode: str, folder: str, trace: bool, threads: int) -> dict[str, Any]:
    """In a fresh process: RSS through the imports and the load, then the peak of one ``mode`` run."""
    got: dict[str, Any] = {"start": status()["VmRSS"]}
    import torch

    got["torch"] = status()["VmRSS"]
    torch.set_num_threads(threads)
    import transformers  # noqa: F401

    import beamkit.hf as bh

    got["transformers"] = status()["VmRSS"]
    loaded = bh.load_pretrained(folder)
    model, tok = loaded.model, loaded.tokenizer
    got["loaded"], got["loaded_file"] = status()["VmRSS"], status()["RssFile"]
    got["weights"] = sum(p.numel() * p.element_size() for p in model.parameters())
    batch = tok(prompts(), return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    probe = KVProbe(model)
    if trace:
        import tracemalloc

        tracemalloc.start()
    kw = {"num_beams": BEAMS, "max_new_tokens": NEW, "num_return_sequences": 1, "pad_token_id": PAD}
    start = time.perf_counter()
    with Sampler() as sampler:
        with torch.inference_mode():
            if mode == "hf":
                out = model.generate(ids, attention_mask=mask, do_sample=False, **kw)
            else:
                out = bh.generate(model, ids, mask, **kw)
    got["seconds"] = time.perf_counter() - start
    if trace:
        import tracemalloc

        got["py_peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    got["new_tokens"] = int(out.shape[1] - ids.shape[1])
    got.update(peak=status()["VmHWM"], maxrss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    got.update(sampled=sampler.peak, at_peak=sampler.at_peak, kv=probe.kv_peak, logits=probe.logits_peak)
    return got


def serve_wrapper(folder: str, port: int, report: str, threads: int) -> int:
    """``beamkit serve hf:FOLDER`` in this process (the command's own code path), with the K/V hook and the
    sampler; on exit (SIGINT, as Ctrl-C) writes what they saw to ``report``."""
    import beamkit.adapters as adapters
    from beamkit.cli import main

    got: dict[str, Any] = {"start": status()["VmRSS"]}
    probes: list[KVProbe] = []
    load = adapters.load

    def load_probed(*args: Any, **kwargs: Any) -> Any:
        import torch  # noqa: F401
        import transformers  # noqa: F401

        import beamkit.hf  # noqa: F401

        got["imported"] = status()["VmRSS"]
        adapter = load(*args, **kwargs)
        got["loaded"], got["loaded_file"] = status()["VmRSS"], status()["RssFile"]
        got["weights"] = sum(p.numel() * p.element_size() for p in adapter.model.parameters())
        probes.append(KVProbe(adapter.model))
        return adapter

    adapters.load = load_probed
    with Sampler() as sampler:
        argv = ["serve", "--model", f"hf:{folder}", "--host", "127.0.0.1", "--port", str(port), "--log-level", "error"]
        rc = main([*argv, "--threads", str(threads)])
    got.update(peak=status()["VmHWM"], sampled=sampler.peak, at_peak=sampler.at_peak)
    got.update(kv=probes[0].kv_peak if probes else 0, logits=probes[0].logits_peak if probes else 0)
    Path(report).write_text(json.dumps(got))
    return rc


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_serve(folder: Path, env: dict[str, str], threads: int) -> dict[str, Any]:
    """Start the server, wait for /health, send the 64 prompts at once, stop it; its figures."""
    port = free_port()
    report = folder / f"serve-{port}.json"
    cmd = [sys.executable, __file__, "--serve-wrapper", str(folder), str(port), str(report), "--threads", str(threads)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    got: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited: {proc.stderr.read() if proc.stderr else ''}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        got["ready"] = status(proc.pid)["VmRSS"]
        with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as r:
            name = json.load(r)["data"][0]["id"]
        results: list[Any] = [None] * PROMPTS

        def send(i: int, text: str) -> None:
            body = {"model": name, "prompt": text, "best_of": BEAMS, "n": 1, "max_tokens": NEW}
            req = urllib.request.Request(
                f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=600) as r:
                results[i] = json.load(r)

        start = time.perf_counter()
        with Sampler(proc.pid, in_process=False) as outside:
            threads = [threading.Thread(target=send, args=(i, p)) for i, p in enumerate(prompts())]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        got["seconds"] = time.perf_counter() - start
        if any(r is None for r in results):
            raise RuntimeError("some completions failed")
        got["new_tokens"] = min(r["usage"]["completion_tokens"] for r in results)
        time.sleep(3.0)  # the engine has been idle a while
        got["after"] = status(proc.pid)["VmRSS"]  # what an idle server keeps after the burst
        got["outside_peak"] = status(proc.pid)["VmHWM"]
        got["outside_sampled"] = outside.peak
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
    inside = json.loads(report.read_text())
    inside["transformers"] = inside.pop("imported")
    return {**inside, **got}


def run_worker(mode: str, folder: Path, env: dict[str, str], threads: int, trace: bool = False) -> dict[str, Any]:
    """One case in a fresh process."""
    if mode == "serve":
        return run_serve(folder, env, threads)
    cmd = [sys.executable, __file__, "--worker", mode, str(folder), "--threads", str(threads)]
    cmd += ["--trace"] if trace else []
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode:
        raise RuntimeError(f"{mode} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------ report
def attribution(r: dict[str, Any]) -> dict[str, float]:
    """The peak split into: baseline (after the imports), the load (model code, tokenizer, config), the weights
    (file pages of the memory-mapped safetensors, read in by the first forward: RssFile's growth), K/V at its
    peak, malloc's free-but-retained bytes, and the rest (transient step tensors)."""
    at = r.get("at_peak", {})
    peak, base = r["peak"], r["transformers"]
    load = r["loaded"] - base
    weights = max(0, at.get("RssFile", r["loaded_file"]) - r["loaded_file"])
    kv, free = r["kv"], at.get("free", 0)
    rest = peak - base - load - weights - kv - free
    return {"baseline": base, "load": load, "weights": weights, "kv": kv, "malloc_free": free, "rest": rest}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="tiny,small,medium")
    p.add_argument("--modes", default="generate,serve,hf")
    p.add_argument("--malloc", action="store_true", help="also rerun generate and serve under glibc tunables")
    p.add_argument("--tracemalloc", action="store_true", help="also one traced generate run of the largest model")
    p.add_argument("--threads", type=int, default=1, help="torch threads of every run (default 1)")
    p.add_argument("--json", default=None, help="write every figure to this file")
    p.add_argument("--worker", nargs=2, metavar=("MODE", "DIR"), help=argparse.SUPPRESS)
    p.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--serve-wrapper", nargs=3, metavar=("DIR", "PORT", "REPORT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.worker[1], args.trace, args.threads)))
        return 0
    if args.serve_wrapper:
        folder, port, report = args.serve_wrapper
        return serve_wrapper(folder, int(port), report, args.threads)

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), *sys.path])}
    for name in ("MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"):
        env.pop(name, None)
    variants = [("default", {})]
    if args.malloc:
        variants += [
            ("mmap1M", {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}),
            ("mmap1M+thp", {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=1048576"}),
        ]
    sizes = [s for s in args.sizes.split(",") if s]
    modes = [m for m in args.modes.split(",") if m]
    rows: list[tuple[str, str, str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            folder = Path(tmp) / size
            folder.mkdir()
            build(size, folder)
            for mode in modes:
                for vname, venv in variants:
                    if vname != "default" and (mode == "hf" or size != sizes[-1]):
                        continue
                    r = run_worker(mode, folder, {**env, **venv}, args.threads)
                    rows.append((size, mode, vname, r))
                    print(f"... {size}/{mode}/{vname}: peak {r['peak'] / MB:.0f} MB", file=sys.stderr, flush=True)
            if args.tracemalloc and size == sizes[-1]:
                r = run_worker("generate", folder, env, args.threads, trace=True)
                rows.append((size, "generate", "tracemalloc", r))
    head = (
        "| model | run | malloc | torch | +transformers | loaded | peak RSS | idle after | baseline | load | weights "
        "| K/V at peak | malloc free (retained) | rest (transient) | s |"
    )
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    for size, mode, vname, r in rows:
        a = attribution(r)
        cells = [
            size, mode, vname, f"{r['torch'] / MB:.0f}" if "torch" in r else "-", f"{r['transformers'] / MB:.0f}",
            f"{r['loaded'] / MB:.0f}", f"**{r['peak'] / MB:.0f}**",
            f"{r['after'] / MB:.0f}" if "after" in r else "-", f"{a['baseline'] / MB:.0f}", f"{a['load'] / MB:.0f}",
            f"{a['weights'] / MB:.0f} ({r['weights'] / MB:.0f} float32)", f"{a['kv'] / MB:.0f}",
            f"{a['malloc_free'] / MB:.0f}", f"{a['rest'] / MB:.0f}", f"{r['seconds']:.1f}",
        ]  # fmt: skip
        print("| " + " | ".join(cells) + " |")
    for size, mode, vname, r in rows:
        tag = size + "/" + mode + ("" if vname == "default" else "/" + vname)
        extra = f" (python objects' peak {r['py_peak'] / MB:.1f} MB)" if "py_peak" in r else ""
        print(f"peak-rss[{tag}]: {r['peak'] / MB:.0f} MB{extra}")
    if args.json:
        Path(args.json).write_text(json.dumps([list(row) for row in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
