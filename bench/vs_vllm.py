"""Benchmark: beamkit's beam search vs vLLM's, like for like, offline and online.

The model is a GPT-2-style decoder (about 23 M parameters: 6 layers, width 384, 32,000 words, float32) built from
a config with a fixed seed and saved with a word-level tokenizer to one folder that both sides load. The same 64
prompts (8-24 words, seeded), beam width 4, 32 new tokens, and no stop token on either side (the model and the
tokenizer have none, and vLLM is also told ``ignore_eos``), so every beam runs the full 32 tokens on both.

- Offline: ``beamkit.hf.generate`` on the 64 prompts (left-padded, one call) vs vLLM's
  ``LLM(...).beam_search(prompts, BeamSearchParams(beam_width=4, max_tokens=32, ignore_eos=True))``, run by
  the ``--vllm-python`` interpreter in its own process (vLLM lives in its own environment). Wall time of the
  search each (model loading excluded), then ``vllm-beam-speedup[offline]: X.XXx`` (vLLM's time over beamkit's)
  and how many prompts get the same top beam (they may differ on near-ties).
- Online: ``beamkit serve hf:DIR`` vs ``vllm serve DIR`` (``python -m vllm.entrypoints.openai.api_server``),
  each a subprocess on a free 127.0.0.1 port; ``--clients`` closed-loop clients send OpenAI completions
  (``use_beam_search: true, n: 4``) for ``--seconds`` seconds (the requests in flight then finish); completed
  requests per second each (from the start to the last completion), then
  ``vllm-beam-speedup[online]: X.XXx`` (beamkit's rate over vLLM's), and each server's peak resident memory (the
  sum of the peaks of its process and its children, read from ``/proc``).

Usage::

    python bench/vs_vllm.py --vllm-python /path/to/vllm-env/bin/python
    python bench/vs_vllm.py --beamkit-only      # beamkit's half alone (no vLLM needed)

The figures need a vLLM install: without ``--vllm-python`` (or when that interpreter cannot import vllm) the
script says so in one line and exits 2, unless ``--beamkit-only`` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VOCAB, LAYERS, WIDTH, HEADS, POSITIONS = 32000, 6, 384, 6, 128
PROMPTS, BEAM, NEW = 64, 4, 32

VLLM_OFFLINE = r"""
import json, sys, time
from vllm import LLM
from vllm.sampling_params import BeamSearchParams
folder, prompts_path, out_path, beam, new = sys.argv[1:6]
prompts = json.load(open(prompts_path))
llm = LLM(model=folder, dtype="float32", seed=0)
params = BeamSearchParams(beam_width=int(beam), max_tokens=int(new), ignore_eos=True)
inputs = [{"prompt_token_ids": ids} for ids in prompts]
start = time.perf_counter()
outs = llm.beam_search(inputs, params)
seconds = time.perf_counter() - start
top = [o.sequences[0].tokens[len(ids):] for o, ids in zip(outs, prompts)]
json.dump({"seconds": seconds, "top": top}, open(out_path, "w"))
"""


def build(folder: Path) -> int:
    """The seeded model and its word-level tokenizer (no stop token) saved in ``folder``; returns its parameters."""
    import torch
    import transformers
    from continuous_batching import save_word_tokenizer

    words = ["[PAD]", "[UNK]", *(f"w{i}" for i in range(VOCAB - 2))]
    save_word_tokenizer(folder, words, unk_token="[UNK]", pad_token="[PAD]")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=LAYERS, n_embd=WIDTH, n_head=HEADS, vocab_size=VOCAB, n_positions=POSITIONS, bos_token_id=None,
        eos_token_id=None, pad_token_id=0, initializer_range=0.1,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(cfg).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    model.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def prompts() -> list[str]:
    """The 64 prompts: 8-24 words each, seeded."""
    import random

    rng = random.Random(0)
    return [" ".join(f"w{rng.randrange(VOCAB - 2)}" for _ in range(rng.randint(8, 24))) for _ in range(PROMPTS)]


def beamkit_offline(folder: Path, texts: list[str], threads: int | None) -> tuple[float, list[list[int]]]:
    """``beamkit.hf.generate`` on every prompt (left-padded, one call): (seconds, top beam's new tokens each)."""
    import torch
    import transformers

    import beamkit.hf

    if threads:
        torch.set_num_threads(threads)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    tok.padding_side = "left"
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    batch = tok(texts, return_tensors="pt", padding=True)
    start = time.perf_counter()
    with torch.inference_mode():
        out = beamkit.hf.generate(
            model, batch["input_ids"], batch["attention_mask"], num_beams=BEAM, max_new_tokens=NEW,
            do_sample=False,
        )  # fmt: skip
    seconds = time.perf_counter() - start
    width = batch["input_ids"].shape[1]
    return seconds, [row[width:].tolist() for row in out]


def vllm_offline(python: str, folder: Path, ids: list[list[int]], work: Path) -> tuple[float, list[list[int]]]:
    """vLLM's offline beam search in its own interpreter: (seconds, top beam's new tokens each)."""
    src, out = work / "prompts.json", work / "vllm.json"
    src.write_text(json.dumps(ids))
    cmd = [python, "-c", VLLM_OFFLINE, str(folder), str(src), str(out), str(BEAM), str(NEW)]
    subprocess.run(cmd, check=True, cwd=work)
    got = json.loads(out.read_text())
    return float(got["seconds"]), got["top"]


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def peak_rss_mib(pid: int) -> float:
    """The peak resident memory of ``pid`` and its live descendants (sum of each one's VmHWM), MiB."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def wait_up(url: str, proc: subprocess.Popen, timeout: float) -> None:
    """Wait until ``GET url/health`` answers 200 (RuntimeError if the server exits or the time runs out)."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before it was up")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server at {url} was not up within {timeout:.0f} s")


def stop(proc: subprocess.Popen) -> None:
    """End the server started here (its own PID): SIGTERM, then SIGKILL after 30 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def load(url: str, body: dict[str, Any], texts: list[str], clients: int, seconds: float) -> tuple[float, int]:
    """``clients`` closed-loop clients sending requests for ``seconds`` (then the ones in flight finish):
    (completed requests per second from the start to the last completion, failed requests)."""
    import httpx

    done, failed, last, lock = [0], [0], [0.0], threading.Lock()
    start = time.monotonic()
    end = start + seconds

    def client(k: int) -> None:
        with httpx.Client(timeout=1800) as http:
            i = k
            while time.monotonic() < end:
                r = http.post(f"{url}/v1/completions", json={**body, "prompt": texts[i % len(texts)]})
                with lock:
                    if r.status_code == 200:
                        done[0] += 1
                        last[0] = time.monotonic()
                    else:
                        failed[0] += 1
                i += clients

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return (done[0] / (last[0] - start) if done[0] else 0.0), failed[0]


def serve_run(name: str, cmd: list[str], body: dict[str, Any], texts: list[str], args: argparse.Namespace) -> dict:
    """Start one server, check one request, load it, read its peak memory, stop it."""
    import httpx

    port = int(cmd[cmd.index("--port") + 1])
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_up(url, proc, args.startup_timeout)
        first = httpx.post(f"{url}/v1/completions", json={**body, "prompt": texts[0]}, timeout=600)
        first.raise_for_status()
        stream = httpx.post(f"{url}/v1/completions", json={**body, "prompt": texts[0], "stream": True}, timeout=600)
        rate, failed = load(url, body, texts, args.clients, args.seconds)
        rss = peak_rss_mib(proc.pid)
    finally:
        stop(proc)
    print(
        f"online[{name}]: {rate:.2f} req/s ({args.clients} closed-loop clients, {args.seconds:.0f} s, "
        f"{failed} failed); peak RSS {rss:.0f} MiB; stream with beam search: HTTP {stream.status_code}",
        flush=True,
    )
    return {"rate": rate, "rss": rss, "top": first.json()["choices"][0]["text"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm-python", help="the Python interpreter of an environment where vllm is installed")
    ap.add_argument("--beamkit-only", action="store_true", help="run beamkit's half alone (no vLLM needed)")
    ap.add_argument("--skip-online", action="store_true", help="the offline comparison only")
    ap.add_argument("--clients", type=int, default=16, help="closed-loop clients online (default 16)")
    ap.add_argument("--seconds", type=float, default=30.0, help="seconds of load per server (default 30)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads for beamkit (default: torch's)")
    ap.add_argument("--startup-timeout", type=float, default=600.0, help="seconds a server may take to start")
    ap.add_argument("--folder", type=Path, help="where the model is saved (default: a temporary folder)")
    args = ap.parse_args()
    if not args.beamkit_only:
        if not args.vllm_python:
            print(
                "vs_vllm: error: give --vllm-python PATH (an interpreter with vllm) or --beamkit-only", file=sys.stderr
            )
            return 2
        try:
            check = subprocess.run([args.vllm_python, "-c", "import vllm"], capture_output=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as exc:
            print(f"vs_vllm: error: cannot run --vllm-python {args.vllm_python}: {exc}", file=sys.stderr)
            return 2
        if check.returncode != 0:
            print(f"vs_vllm: error: {args.vllm_python} cannot import vllm", file=sys.stderr)
            return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="vs-vllm-") as tmp:
        work = Path(tmp)
        folder = args.folder or work / "gpt2-23m"
        folder.mkdir(parents=True, exist_ok=True)
        params = build(folder)
        texts = prompts()
        print(
            f"model: GPT-2 style, {params / 1e6:.1f} M parameters, float32; {PROMPTS} prompts, beam {BEAM}, "
            f"{NEW} new tokens"
        )
        import transformers

        tok = transformers.AutoTokenizer.from_pretrained(folder)
        ids = [tok(t)["input_ids"] for t in texts]

        mine, mine_top = beamkit_offline(folder, texts, args.threads)
        print(f"offline[beamkit]: {mine:.2f} s", flush=True)
        if not args.beamkit_only:
            theirs, their_top = vllm_offline(args.vllm_python, folder, ids, work)
            print(f"offline[vllm]: {theirs:.2f} s")
            print(f"vllm-beam-speedup[offline]: {theirs / mine:.2f}x")
            agree = sum(a == b for a, b in zip(mine_top, their_top, strict=True))
            print(f"vllm-top-beam[offline]: {agree}/{PROMPTS} identical", flush=True)
        if args.skip_online:
            return 0

        code = "import sys; from beamkit.cli import main; sys.exit(main(sys.argv[1:]))"
        port = free_port()
        cmd = [
            sys.executable,
            "-c",
            code,
            "serve",
            "--model",
            f"hf:{folder}",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        name = folder.name
        body = {"model": name, "max_tokens": NEW, "n": BEAM, "use_beam_search": True}
        ours = serve_run("beamkit", cmd, body, texts, args)
        if not args.beamkit_only:
            port = free_port()
            vcmd = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder)]
            vcmd += ["--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--seed", "0"]
            vbody = {"model": str(folder), "max_tokens": NEW, "n": BEAM, "use_beam_search": True}
            vbody.update(ignore_eos=True, temperature=0.0)
            theirs_online = serve_run("vllm", vcmd, vbody, texts, args)
            print(f"vllm-beam-speedup[online]: {ours['rate'] / theirs_online['rate']:.2f}x")
            print(f"vllm-memory[online]: beamkit {ours['rss'] / theirs_online['rss']:.2f}x vLLM's peak RSS")
            same = ours["top"] == theirs_online["top"]
            print(f"vllm-top-beam[online]: first prompt's top beam {'identical' if same else 'differs'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
