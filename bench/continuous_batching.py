"""Continuous batching against static batching and one request at a time, under Poisson arrivals.

Workloads (``--workload``):

* ``hf`` (the default): a decoder-only Hugging Face model, GPT-2 built offline from a config with a fixed seed
  (:func:`build_hf_model`: width 512, 4 layers, vocabulary 8,192, about 21 M parameters, one torch thread), so
  that the model's forward dominates each step. Beam 4, prompts of 8 random tokens. The stop token is the
  model's favourite at every step by a wide margin (its logit is a constant 30, every other logit is the random
  model's, within a few units of 0), and each request has its own minimum length, drawn log-uniformly so that
  its stop token fires at step 2-128 (``min_len`` = that step minus one, the engine masking the stop token
  before it): every beam of a request ends at the same, widely varying step, as a request's outputs vary in a
  real service, and that is what makes a static batch wait for its slowest member.
* ``g2p``: the pretrained g2p-en GRU (numpy, shipped by the ``g2p-en`` package) on CMUdict words, beam 5:
  outputs of 2-15 phonemes. Light (about 1,000 requests/s), so batching shows little.

Capacity (requests/s) is measured first in the same run: ``--capacity-requests`` requests there at once,
through the continuous engine (up to ``--batch`` running). Requests then arrive as a Poisson process at
``--load`` times that capacity for ``--seconds`` seconds (``--requests`` instead fixes their number), and the
servers, in one process, in turn:

* **continuous**: one :class:`beamkit.Engine`; before every step the requests that arrived join (up to
  ``--batch`` running), finished ones leave at once;
* **static**: collect up to ``B`` requests or wait ``W`` after the first, decode the batch to completion (one
  closed batch of the engine, as ``search_batch`` runs it; every request of the batch is answered at its end),
  repeat; for each ``B:W`` of ``--static`` (a comma-separated list), the best by throughput reported;
* **one at a time**: each request decoded alone, in arrival order. It cannot keep up with these arrivals,
  so it is time-boxed: it serves the first requests only, until ``--single-seconds`` have passed (said in the
  output).

Latency is completion minus arrival; throughput is requests over the time from the first arrival to the last
completion. Every request's hypotheses are checked equal across the servers. Prints p50 / p99 latency and
requests/s for each, the share of the continuous run's time spent in the model's forward (``hf``), then
``cb-vs-static[throughput]: X.XXx`` and ``cb-vs-static[p99-latency]: X.XXx`` (continuous / the best static by
throughput), and the p99 ratio against the static configuration of the lowest p99.

    python bench/continuous_batching.py [--workload hf] [--load 0.8] [--seconds 60] [--batch 16]
        [--static 8:0.5,16:1,32:2] [--single-seconds 30]
    python bench/continuous_batching.py --workload g2p [--requests 300] [--load 0.9] [--batch 32] [--static 32:0.02]
"""

from __future__ import annotations

import argparse
import os
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from beamkit import Engine

# --------------------------------------------------------------------------------------------- the workloads
HF = {"width": 512, "layers": 4, "heads": 8, "vocab": 8192, "positions": 1024}
HF_BEAM, HF_PROMPT, HF_LONGEST = 4, 8, 128  # beam, prompt tokens, the latest step the stop token fires at
PAD, BOS, EOS = 0, 1, 2  # the hf model's special tokens
EOS_LOGIT = 30.0


def build_hf_model(seed: int = 0) -> Any:
    """The ``hf`` workload's GPT-2, built offline from a config with ``torch.manual_seed(seed)``, in eval mode.

    The random model is left as it is except for the stop token ``EOS``: the final layer norm's last feature is
    made a constant 1 (weight 0, bias 1), only ``EOS``'s output row reads it (with weight ``EOS_LOGIT``), and
    that row reads nothing else. So ``EOS``'s logit is exactly ``EOS_LOGIT`` at every step, far above the others
    (the random model's, about N(0, 0.5)): it is chosen by every beam as soon as the minimum length allows.
    Input and output embeddings are untied (the input embedding of ``EOS`` stays the random one).
    """
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(
        vocab_size=HF["vocab"], n_positions=HF["positions"], n_embd=HF["width"], n_layer=HF["layers"],
        n_head=HF["heads"], bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, tie_word_embeddings=False,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        ln = model.transformer.ln_f
        ln.weight[-1] = 0.0
        ln.bias[-1] = 1.0
        head = model.lm_head.weight  # shape: (V, width)
        head[:, -1] = 0.0
        head[EOS] = 0.0
        head[EOS, -1] = EOS_LOGIT
    model.generation_config.eos_token_id = EOS
    model.generation_config.pad_token_id = PAD
    return model


def hf_words() -> list[str]:
    """The word-level vocabulary of the ``hf`` workload's tokenizer (see :func:`save_hf_folder`)."""
    return ["[PAD]", "[BOS]", "[EOS]", "[UNK]", *(f"w{i}" for i in range(HF["vocab"] - 4))]


def save_word_tokenizer(folder: str | os.PathLike, words: list[str], **special: str) -> None:
    """A word-level tokenizer over ``words`` (a word's id is its index; text splits on whitespace), built offline
    and saved in ``folder`` where ``hf:DIR`` loads it. ``special``: its special tokens (``unk_token`` required,
    ``pad_token``, ``bos_token``, ``eos_token``), each one of ``words``. The Hugging Face benchmarks share it."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=special["unk_token"]))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=backend, **special).save_pretrained(folder)


def save_hf_folder(model: Any, folder: str | os.PathLike) -> None:
    """``model`` and a word-level tokenizer (``w0 w1 ...``, built offline) saved where ``hf:DIR`` loads them."""
    special = {"unk_token": "[UNK]", "pad_token": "[PAD]", "bos_token": "[BOS]", "eos_token": "[EOS]"}
    save_word_tokenizer(folder, hf_words(), **special)
    model.save_pretrained(folder)


def hf_requests(n: int, seed: int) -> list[tuple[list[int], int]]:
    """``n`` requests: (prompt ids, the step their stop token fires at, log-uniform in 2..HF_LONGEST)."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(4, HF["vocab"], size=(n, HF_PROMPT))
    steps = np.floor(np.exp(rng.uniform(np.log(2), np.log(HF_LONGEST + 1), size=n))).astype(int)
    return [(p.tolist(), int(min(s, HF_LONGEST))) for p, s in zip(prompts, steps, strict=True)]


@dataclass
class Workload:
    """What the servers decode: a request's initial state, bos / eos and per-request options."""

    name: str
    step: Any
    requests: list[Any]
    engine_options: dict[str, Any]

    def state(self, i: int) -> Any:
        """The initial state (one row) of request ``i``."""
        raise NotImplementedError

    def options(self, i: int) -> dict[str, Any]:
        """Per-request options of request ``i`` (``Engine.add``)."""
        return {}

    bos: int = BOS
    eos: int = EOS

    def add(self, engine: Engine, i: int) -> int:
        """Add request ``i`` to ``engine``; its id."""
        return engine.add(self.state(i), self.bos, self.eos, **self.options(i))


class HFWorkload(Workload):
    """The ``hf`` workload over :class:`beamkit.hf.DecoderOnlyStep`."""

    def state(self, i: int) -> Any:
        import torch

        ids = torch.tensor([self.requests[i][0]])  # shape: (1, P)
        return self.step.init_state(ids, torch.ones_like(ids))

    def options(self, i: int) -> dict[str, Any]:
        return {"min_len": self.requests[i][1] - 1}


class G2PWorkload(Workload):
    """The ``g2p`` workload: g2p-en on CMUdict words."""

    def __init__(self, model: Any, words: list[str], bos: int, eos: int, max_len: int):
        super().__init__("g2p-en", model.step, words, {"beam_size": 5, "max_len": max_len, "length_penalty": 1.0})
        self.model, self.bos, self.eos = model, bos, eos

    def state(self, i: int) -> Any:
        return self.model.init_state([self.requests[i]])


def make_workload(args: argparse.Namespace, n: int) -> Workload:
    """The workload of ``args.workload`` with ``n`` requests."""
    if args.workload == "g2p":
        from beamkit.models.g2p import BOS as G_BOS
        from beamkit.models.g2p import EOS as G_EOS
        from beamkit.models.g2p import MAX_LEN, G2PModel
        from beamkit.tasks.g2p import sample_words

        words = [w for w, _ in sample_words(n, seed=args.seed + 1)]
        return G2PWorkload(G2PModel.load(), words, G_BOS, G_EOS, MAX_LEN)
    import torch

    from beamkit.hf import DecoderOnlyStep

    torch.set_num_threads(args.threads)
    step = DecoderOnlyStep(build_hf_model(args.seed))
    options = {"beam_size": HF_BEAM, "max_len": HF_LONGEST, "policy": "pool"}
    return HFWorkload("hf gpt2", step, hf_requests(n, args.seed + 1), options)


# --------------------------------------------------------------------------------------------- the servers
def one_at_a_time(w: Workload, order: list[int], arrivals: np.ndarray, budget: float):
    """Each request alone, in arrival order, until ``budget`` seconds have passed; (finish times, results)."""
    done, out = [], []
    t0 = time.perf_counter()
    for i in order:
        if time.perf_counter() - t0 > budget:
            break
        _sleep_until(t0 + arrivals[i])
        engine = Engine(w.step, on_step_error="raise", **w.engine_options)
        w.add(engine, i)
        while not engine.idle:
            for c in engine.step():
                out.append(c.hypotheses)
        done.append(time.perf_counter() - t0)
    return np.array(done), out


def static(w: Workload, arrivals: np.ndarray, batch: int, wait: float):
    """Batches of up to ``batch`` arrived requests (waiting up to ``wait`` s after the first), each decoded to
    completion as one closed batch and answered at its end."""
    n = len(arrivals)
    done = np.zeros(n)
    out: list = [None] * n
    t0 = time.perf_counter()
    i = 0
    while i < n:
        _sleep_until(t0 + arrivals[i])
        deadline = t0 + arrivals[i] + wait
        j = i + 1
        while j < n and j - i < batch:
            now = time.perf_counter()
            if t0 + arrivals[j] <= now:
                j += 1
            elif now >= deadline:
                break
            else:
                _sleep_until(min(t0 + arrivals[j], deadline))
        engine = Engine(w.step, on_step_error="raise", **w.engine_options)
        ids = {w.add(engine, k): k for k in range(i, j)}
        while not engine.idle:
            for c in engine.step():
                out[ids[c.request_id]] = c.hypotheses
        done[i:j] = time.perf_counter() - t0
        i = j
    return done, out


def continuous(w: Workload, arrivals: np.ndarray, batch: int):
    """One engine; arrived requests join before each step (up to ``batch`` running)."""
    engine = Engine(w.step, on_step_error="raise", **w.engine_options)
    n = len(arrivals)
    done = np.zeros(n)
    out: list = [None] * n
    index: dict[int, int] = {}
    waiting = deque(range(n))
    t0 = time.perf_counter()
    while waiting or not engine.idle:
        now = time.perf_counter() - t0
        while waiting and arrivals[waiting[0]] <= now and engine.running < batch:
            i = waiting.popleft()
            index[w.add(engine, i)] = i
        if engine.idle:
            _sleep_until(t0 + arrivals[waiting[0]])
            continue
        for c in engine.step():
            i = index.pop(c.request_id)
            done[i] = time.perf_counter() - t0
            out[i] = c.hypotheses
    return done, out, engine.stats


def _sleep_until(t: float) -> None:
    while True:
        left = t - time.perf_counter()
        if left <= 0:
            return
        time.sleep(min(left, 0.001))


def summary(name: str, done: np.ndarray, arrivals: np.ndarray) -> tuple[float, float]:
    """Print and return (throughput, p99 latency in ms)."""
    lat = (done - arrivals) * 1000
    tput = len(done) / (done.max() - arrivals.min())
    p50, p99 = np.percentile(lat, [50, 99])
    print(f"{name:>22}: {len(done):5d} requests {tput:7.2f} req/s  p50 {p50:9.1f} ms  p99 {p99:9.1f} ms", flush=True)
    return tput, float(p99)


def same(a, b) -> bool:
    """Whether two servers' results (lists of hypothesis lists) have the same tokens."""
    return all([h.tokens for h in x] == [h.tokens for h in y] for x, y in zip(a, b, strict=True))


def load_average() -> str:
    """The 1-minute load average (other processes on the machine), for the record."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "?"


def parse_static(text: str) -> list[tuple[int, float]]:
    """``"8:0.5,16:1"`` -> [(8, 0.5), (16, 1.0)]: static batch sizes and waits in seconds."""
    out = []
    for item in text.split(","):
        b, _, wait = item.partition(":")
        out.append((int(b), float(wait or 0)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=("hf", "g2p"), default="hf")
    ap.add_argument("--load", type=float, default=None, help="arrival rate / capacity (hf 0.8, g2p 0.9)")
    ap.add_argument("--seconds", type=float, default=60.0, help="arrivals for this long (hf)")
    ap.add_argument("--requests", type=int, default=None, help="instead of --seconds: this many requests")
    ap.add_argument("--capacity-requests", type=int, default=None, help="requests of the capacity run (hf 64)")
    ap.add_argument("--batch", type=int, default=None, help="max requests running in the engine (hf 16, g2p 32)")
    ap.add_argument("--static", default=None, help="static batch sizes:waits (s), e.g. 8:0.5,16:1,32:2")
    ap.add_argument("--single-seconds", type=float, default=30.0, help="time box of the one-at-a-time server")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (hf)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    hf = args.workload == "hf"
    load = args.load if args.load is not None else (0.8 if hf else 0.9)
    batch = args.batch or (16 if hf else 32)
    statics = parse_static(args.static or ("8:0.5,16:1,32:2" if hf else "32:0.02"))
    n_cap = args.capacity_requests or (64 if hf else 300)
    if not hf and args.requests is None:
        args.requests = 300
    n_max = args.requests or 100_000
    w = make_workload(args, max(n_cap, 20) if args.requests is None else max(args.requests, n_cap, 20))

    warm = np.zeros(min(20, len(w.requests)))
    continuous(w, warm, batch)  # warm-up
    cap_done, _, _ = continuous(w, np.zeros(n_cap), batch)
    capacity = n_cap / cap_done.max()
    rate = load * capacity
    rng = np.random.default_rng(args.seed)
    gaps = rng.exponential(1.0 / rate, size=n_max if args.requests else int(rate * args.seconds * 2) + 10)
    arrivals = np.cumsum(gaps) - gaps[0]
    arrivals = arrivals[: args.requests] if args.requests else arrivals[arrivals < args.seconds]
    n = len(arrivals)
    if n > len(w.requests):  # hf, sized by --seconds: more requests for the same model
        w.requests = hf_requests(n, args.seed + 1)
    label = f"{w.name}, beam {w.engine_options['beam_size']}"
    print(
        f"{label}: capacity {capacity:.2f} req/s ({n_cap} requests at once, up to {batch} running); "
        f"{n} requests arriving at {rate:.2f} req/s ({load:.2f}x) over {arrivals[-1]:.1f} s; load average "
        f"{load_average()}",
        flush=True,
    )
    fwd0 = getattr(w.step, "forward_seconds", 0.0)
    t = time.perf_counter()
    dc, oc, stats = continuous(w, arrivals, batch)
    wall = time.perf_counter() - t
    fwd = getattr(w.step, "forward_seconds", 0.0) - fwd0
    t_c, p_c = summary("continuous", dc, arrivals)
    rows = np.asarray(stats.rows_per_call)
    print(
        f"{'':>22}  {len(rows)} steps, {rows.mean():.1f} rows a step"
        + (f", forward {fwd:.1f} s of {wall:.1f} s ({fwd / wall:.0%})" if hf else "")
        + f"; load average {load_average()}",
        flush=True,
    )
    best = quick = None  # the best static configuration by throughput, by p99 latency
    for b, wait in statics:
        ds, os_ = static(w, arrivals, b, wait)
        got = summary(f"static {b}:{wait:g}s", ds, arrivals)
        print(f"{'':>22}  load average {load_average()}", flush=True)
        if not same(os_, oc):
            raise SystemExit(f"results differ between continuous and static {b}:{wait:g}s")
        if best is None or got[0] > best[0]:
            best = (*got, f"{b}:{wait:g}s")
        if quick is None or got[1] < quick[1]:
            quick = (*got, f"{b}:{wait:g}s")
    assert best is not None and quick is not None
    d1, o1 = one_at_a_time(w, list(range(n)), arrivals, args.single_seconds)
    summary(f"one at a time ({len(d1)})", d1, arrivals[: len(d1)])
    print(f"{'':>22}  time-boxed at {args.single_seconds:g} s: the first {len(d1)} of {n} requests only")
    if not same(o1, oc[: len(o1)]):
        raise SystemExit("results differ between continuous and one at a time")
    t_s, p_s, which = best
    print(f"best static (by throughput): {which}; load average {load_average()}")
    print(f"cb-vs-static[throughput]: {t_c / t_s:.2f}x")
    print(f"cb-vs-static[p99-latency]: {p_c / p_s:.2f}x")
    print(f"cb-vs-static[p99-latency, against the static of the lowest p99 ({quick[2]})]: {p_c / quick[1]:.2f}x")


if __name__ == "__main__":
    main()
