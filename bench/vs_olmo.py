"""Benchmark: beamkit's beam search vs OLMo's ``BeamSearch`` (AllenNLP's design) on the same step function.

The model is a small seeded torch recurrence, one step function for both searches: a state ``h`` ``[rows, 64]``
and a step counter ``t`` ``[rows]`` (both reordered by each search's backpointers), ``h' = tanh(E[y] + h @ U)``,
``logits = h' @ W`` over V = 1000 tokens (float32) plus a bias on the end token that grows with ``t``, so that
hypotheses end at varied steps. Each search calls it under its own contract: OLMo's step returns
``log_softmax(logits)``, beamkit's the logits (the engine normalises them). Defaults: batch 32, beam 5, 30 steps
(OLMo's ``max_steps``, beamkit's ``max_len``, the end token counted in both), CPU, one torch thread, raw
log-probabilities as scores (OLMo's default ``SequenceLogProbabilityScorer``, beamkit's ``length_penalty=0.0``).

OLMo keeps a finished hypothesis as a row fed end tokens at log-probability 0, so it evaluates batch x beam rows
every step and better live candidates can displace a finished one: beamkit's ``compete`` policy is that rule,
with only the live rows evaluated. ``narrow`` (beamkit's default, the exact contract) lets a finished hypothesis
keep its slot while the beam narrows, so its results may differ from OLMo's. For each policy, after a checked
run, the two searches alternate (``--repeats`` times each, the order swapped every repeat) and the medians print::

    olmo-speed[compete]: 1.23x (beamkit 45.1 ms, OLMo 55.4 ms; model rows 3840 vs 4800); target >= 1.5x: missed
    olmo-top1[compete]: 32/32 identical

``1.23x`` is OLMo's time over beamkit's; model rows are the rows each search sent to the step function. Then the
drop-in, ``beamkit.compat.olmo``, runs OLMo's own program (the same ``BeamSearch(...).search`` call and step
function, which returns ``log_softmax`` itself) against OLMo's module::

    olmo-speed[compat]: 1.60x (beamkit.compat.olmo 46.0 ms, OLMo 73.6 ms); target >= 1.5x: met
    olmo-top1[compat]: 32/32 identical; top-1 log-probabilities at most 3.8e-06 apart

``identical`` counts the requests whose best hypothesis has the same tokens (OLMo's ``predictions[b, 0]`` cut
after its first end token, as OLMo pads a finished beam with end tokens; beamkit's tokens, end token included)
and a log-probability within a rounding bound (``logprob_tolerance``). The script exits 1 unless every request
agrees under ``compete`` and through the drop-in.

Precision: the model runs in float32 and so do its logits. OLMo accumulates running log-probabilities in the
step's dtype, beamkit in float64, so two candidates closer than an ulp of the running sum (3.8e-6 near -44) can
be ranked apart: a draft of this bench with a flatter model had one such near-tie (6e-7 apart, ranks 5 and 6 of
a request at step 22), and that request's top-1 differed. ``--float64`` has the step return float64 logits (the
model itself still in float32), so both searches rank the same float64 sums. Calls of fewer than 4 rows are
padded to 4 inside the step (below that BLAS takes other kernels, which round differently), so a prefix gets
bit-identical logits in OLMo's full batches and in beamkit's compact ones.

OLMo's code is not part of this repository: the first run downloads the ``ai2-olmo==0.6.0`` wheel from the
package index (``pip download --no-deps``) into ``bench/.cache/``, extracts only ``olmo/beam_search.py`` (checked
against the wheel's RECORD; it imports only torch and the standard library), deletes the wheel, and loads that
one module with importlib; the package and its dependencies are never installed.

The target is 1.5x in each line; ``--profile`` prints where beamkit's time goes (its top functions under
cProfile) for each line that misses it.

``--model bigram`` runs the second shape of the same workload (same sizes, one torch thread, top-1 checked the
same way): a different, cheaper step (a bigram table plus a leaky sum of token embeddings, see :class:`Bigram`),
so the search's own cost weighs more.

Run: ``.venv/bin/python bench/vs_olmo.py [--repeats 7] [--batch 32] [--beam 5] [--vocab 1000] [--steps 30]
[--model rnn|bigram] [--profile]``.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import statistics
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
from olmo_source import CACHE, OLMO_PACKAGE, OLMO_VERSION, fail, fetch_olmo

from beamkit import BeamSearch, SearchOptions, SearchResult

DIM, BOS, EOS = 64, 0, 1
MIN_ROWS = 4  # smallest row count the step sends to BLAS (see the module docstring)
# the end token's bias EOS_BIAS0 + EOS_SLOPE * t: unlikely in the first steps, then more and more likely
EOS_BIAS0, EOS_SLOPE = -2.0, 0.35


class Model:
    """The step computation both searches call: seeded float32 weights, deterministic, rows independent."""

    def __init__(self, vocab: int, dtype: torch.dtype, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.E = torch.randn(vocab, DIM, generator=g)
        self.U = torch.randn(DIM, DIM, generator=g) * (0.9 / math.sqrt(DIM))
        self.W = torch.randn(DIM, vocab, generator=g) * (5.0 / math.sqrt(DIM))
        self.eos_row = torch.zeros(vocab)
        self.eos_row[EOS] = 1.0
        self.dtype = dtype  # of the logits the step returns
        self.rows = 0  # rows evaluated since the last reset
        self.step_s = 0.0  # seconds spent in olmo_step since the last reset

    def init_state(self, batch: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(1)
        return {"h": torch.randn(batch, DIM, generator=g), "t": torch.zeros(batch)}

    def __call__(self, h: torch.Tensor, y: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        """``(logits [rows, V] in self.dtype, new_state)`` for the rows ``(h, y, t)``."""
        n = y.shape[0]
        h, y, t = self.padded(h, y, t)
        h = torch.tanh(self.E[y] + h @ self.U)
        logits = torch.addr(h @ self.W, EOS_BIAS0 + EOS_SLOPE * t, self.eos_row)  # the end token's growing bias
        return logits[:n].to(self.dtype), {"h": h[:n], "t": t[:n] + 1.0}

    def padded(self, h: torch.Tensor, y: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The rows ``(h, y, t)`` counted, and padded with zero rows to at least ``MIN_ROWS`` (both shapes run their
        matrix products on at least that many rows, whatever the search hands them)."""
        n = y.shape[0]
        self.rows += n
        if n >= MIN_ROWS:
            return h, y, t
        pad = MIN_ROWS - n
        return torch.cat([h, h.new_zeros(pad, DIM)]), torch.cat([y, y.new_zeros(pad)]), torch.cat([t, t.new_zeros(pad)])

    def olmo_step(self, last_predictions: torch.Tensor, state: dict[str, torch.Tensor]):
        """OLMo's contract: ``step(last_predictions, state) -> (log_probs [rows, V], state)``."""
        t0 = time.perf_counter()
        logits, new = self(state["h"], last_predictions, state["t"])
        out = torch.log_softmax(logits, dim=-1)
        self.step_s += time.perf_counter() - t0
        return out, new

    def beamkit_step(self, state: dict[str, torch.Tensor], y_prev: Any):
        """beamkit's contract: ``step_fn(state, y_prev) -> (logits [rows, V], state)``, the engine normalising the
        logits; it gathers the state's rows itself."""
        return self(state["h"], torch.as_tensor(y_prev, dtype=torch.int64), state["t"])


class Bigram(Model):
    """The second shape of the workload: a cheaper, different step over the same state layout. A bigram table
    ``B[y]`` (V x V, float32) plus a leaky sum of token embeddings ``h' = 0.5 h + F[y]`` read out through ``G``
    (``h @ G``, 64 x V), and the same growing bias on the end token. No tanh, no recurrent matrix product: the
    model costs less than :class:`Model`'s, so the search's own cost weighs more in the ratio."""

    def __init__(self, vocab: int, dtype: torch.dtype, seed: int = 0):
        super().__init__(vocab, dtype, seed)
        g = torch.Generator().manual_seed(seed + 11)
        self.B = torch.randn(vocab, vocab, generator=g) * 2.0
        self.F = torch.randn(vocab, DIM, generator=g) * 0.5
        self.G = torch.randn(DIM, vocab, generator=g) * (2.0 / math.sqrt(DIM))

    def __call__(self, h: torch.Tensor, y: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        n = y.shape[0]
        h, y, t = self.padded(h, y, t)
        h = 0.5 * h + self.F[y]
        logits = torch.addr(torch.addmm(self.B[y], h, self.G), EOS_BIAS0 + EOS_SLOPE * t, self.eos_row)
        return logits[:n].to(self.dtype), {"h": h[:n], "t": t[:n] + 1.0}


MODELS = {"rnn": Model, "bigram": Bigram}


def run_olmo(olmo: ModuleType, model: Model, args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    """OLMo's ``(predictions [batch, beam, steps], log_probs [batch, beam])``, best first."""
    search = olmo.BeamSearch(EOS, max_steps=args.steps, beam_size=args.beam)
    start = torch.full((args.batch,), BOS, dtype=torch.int64)
    return search.search(start, model.init_state(args.batch), model.olmo_step)


def run_beamkit(model: Model, args: argparse.Namespace, policy: str) -> SearchResult:
    opts = SearchOptions(beam_size=args.beam, max_len=args.steps, policy=policy, length_penalty=0.0)
    return BeamSearch(opts).search(model.beamkit_step, model.init_state(args.batch), BOS, EOS)


def cut(seq: list[int]) -> list[int]:
    """A sequence of OLMo's cut after its first end token (OLMo pads a finished beam with end tokens)."""
    return seq[: seq.index(EOS) + 1] if EOS in seq else seq


def logprob_tolerance(logprob: float, length: int, vocab: int, dtype: torch.dtype) -> float:
    """How far the two searches' log-probabilities of one path of ``length`` tokens may be apart by rounding.

    Both get bit-identical logits x in ``dtype`` for a prefix; u is that dtype's unit roundoff (2**-24 for
    float32). OLMo's step computes ``(x_i - m) - log(sum(exp(x - m)))`` in ``dtype``: |x_i - m| <= |lp_i|, the
    cascaded sum of V exponentials is off by about (log2 V + 1) u relative and the logarithm adds u ln V, so a
    term is within u (2 |lp_i| + ln V + log2 V + 2); OLMo then adds ``length`` terms in ``dtype``, each addition
    off by u times the running sum (at most |logprob|, the terms being negative). beamkit subtracts the log of a
    ``dtype`` sum of exponentials from x in float64: within u (log2 V + 2) a term. The sum of both bounds is at
    most ``u ((length + 2) |logprob| + 2 length (ln V + log2 V + 2))``; the tolerance is twice that.
    """
    u = torch.finfo(dtype).eps / 2
    per_token = math.log(vocab) + math.log2(vocab) + 2.0
    return 2.0 * u * ((length + 2) * abs(logprob) + 2 * length * per_token)


def compare(
    predictions: torch.Tensor, log_probs: torch.Tensor, result: SearchResult, vocab: int, dtype: torch.dtype
) -> tuple[int, int, float, str]:
    """(requests whose top-1 agrees, requests whose whole n-best list has the same sequences in the same order,
    the largest top-1 log-probability difference, the first top-1 disagreement)."""
    same, lists, worst, first = 0, 0, 0.0, ""
    for b, (seqs, lp) in enumerate(zip(predictions.tolist(), log_probs[:, 0].tolist(), strict=True)):
        toks, hyps = cut(seqs[0]), result.hypotheses[b]
        diff = abs(hyps[0].logprob - lp)
        worst = max(worst, diff)
        if hyps[0].tokens == toks and diff <= logprob_tolerance(lp, len(toks), vocab, dtype):
            same += 1
        elif not first:
            first = f"request {b}: OLMo {toks} ({lp:.7g}), beamkit {hyps[0].tokens} ({hyps[0].logprob:.7g})"
        lists += [cut(seq) for seq in seqs] == [h.tokens for h in hyps]
    return same, lists, worst, first


TARGET = 1.5  # beamkit at least 1.5x OLMo's speed, in each policy and through the drop-in


def target(ratio: float) -> str:
    """The target and whether ``ratio`` (OLMo's time over beamkit's) meets it."""
    return f"target >= {TARGET}x: {'met' if ratio >= TARGET else 'missed'}"


def profile(fn: Callable[[], Any], what: str, runs: int = 5) -> None:
    """Where ``fn``'s time goes (``--profile``, printed when a target is missed): its top functions by own time
    over ``runs`` calls, under cProfile (which inflates the many small Python calls against the model's)."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(runs):
        fn()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
    body = out.getvalue().split("ncalls", 1)[-1]
    print(f"  profile of {what} ({runs} runs; own time, seconds):\n  ncalls" + body.rstrip().replace("\n", "\n  "))


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument(
        "--model", default="rnn", choices=sorted(MODELS), help="the step: rnn (default) or bigram (the second shape)"
    )
    ap.add_argument("--float64", action="store_true", help="float64 logits: both searches rank float64 sums")
    ap.add_argument("--profile", action="store_true", help="profile beamkit's search where a target is missed")
    args = ap.parse_args()
    for name in ("repeats", "batch", "beam", "vocab", "steps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1")
    load = os.getloadavg()
    print(f"load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1, 5, 15 min) on {os.cpu_count()} CPUs")
    olmo = fetch_olmo(CACHE)
    torch.set_num_threads(1)
    dtype = torch.float64 if args.float64 else torch.float32
    model = MODELS[args.model](args.vocab, dtype)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread; OLMo's beam_search from {OLMO_PACKAGE} "
        f"{OLMO_VERSION}; {args.model} step; batch {args.batch}, beam {args.beam}, V {args.vocab}, {args.steps} steps, "
        f"{str(dtype).removeprefix('torch.')} logits"
    )

    model.rows = 0
    predictions, log_probs = run_olmo(olmo, model, args)
    olmo_rows = model.rows
    seqs = [cut(s) for s in predictions.reshape(-1, predictions.shape[-1]).tolist()]
    ends = sorted(len(s) for s in seqs if s[-1] == EOS)
    top_ends = sum(cut(s)[-1] == EOS for s in predictions[:, 0].tolist())
    span = f"lengths {ends[0]}..{ends[-1]}, median {statistics.median(ends):g}" if ends else "none"
    print(
        f"OLMo: {len(ends)}/{len(seqs)} hypotheses end with the end token ({span}); "
        f"top-1: {top_ends}/{args.batch} end, {args.batch - top_ends} cut at {args.steps}"
    )

    failed = False
    for policy in ("compete", "narrow"):
        result = run_beamkit(model, args, policy)
        rows = result.stats.rows_total
        same, lists, worst, first = compare(predictions, log_probs, result, args.vocab, dtype)
        runs: dict[str, Callable[[], Any]] = {
            "olmo": functools.partial(run_olmo, olmo, model, args),
            "beamkit": functools.partial(run_beamkit, model, args, policy),
        }
        times: dict[str, list[float]] = {"olmo": [], "beamkit": []}
        for r in range(args.repeats):
            for name in ("olmo", "beamkit") if r % 2 == 0 else ("beamkit", "olmo"):
                times[name].append(timed(runs[name]))
        bk, ol = statistics.median(times["beamkit"]), statistics.median(times["olmo"])
        print(
            f"olmo-speed[{policy}]: {ol / bk:.2f}x (beamkit {bk * 1e3:.1f} ms, OLMo {ol * 1e3:.1f} ms; "
            f"model rows {rows} vs {olmo_rows}); {target(ol / bk)}"
        )
        if args.profile and ol / bk < TARGET:
            profile(functools.partial(run_beamkit, model, args, policy), f"beamkit[{policy}]")
        print(f"olmo-top1[{policy}]: {same}/{args.batch} identical")
        note = f"; first difference: {first}" if first else ""
        print(
            f"  top-1 log-probabilities at most {worst:.1e} apart; all {args.beam} hypotheses the same "
            f"for {lists}/{args.batch}{note}"
        )
        failed |= policy == "compete" and same != args.batch
    # the drop-in: OLMo's own API and step function, run by beamkit's engine (compete, log-probabilities as given)
    from beamkit.compat import olmo as compat

    cp, cl = run_olmo(compat, model, args)
    same = sum(cut(a[0]) == cut(b[0]) for a, b in zip(predictions.tolist(), cp.tolist(), strict=True))
    worst = float((cl[:, 0].double() - log_probs[:, 0].double()).abs().max())
    runs = {
        "olmo": functools.partial(run_olmo, olmo, model, args),
        "compat": functools.partial(run_olmo, compat, model, args),
    }
    times: dict[str, list[float]] = {"olmo": [], "compat": []}
    in_step: dict[str, list[float]] = {"olmo": [], "compat": []}
    for r in range(args.repeats):
        for name in ("olmo", "compat") if r % 2 == 0 else ("compat", "olmo"):
            model.step_s = 0.0
            times[name].append(timed(runs[name]))
            in_step[name].append(model.step_s)
    co, ol = statistics.median(times["compat"]), statistics.median(times["olmo"])
    cs, os_ = statistics.median(in_step["compat"]), statistics.median(in_step["olmo"])
    print(
        f"olmo-speed[compat]: {ol / co:.2f}x (beamkit.compat.olmo {co * 1e3:.1f} ms, OLMo {ol * 1e3:.1f} ms); "
        f"{target(ol / co)}"
    )
    print(
        f"  in the step function (model + log_softmax): beamkit.compat.olmo {cs * 1e3:.1f} ms, OLMo {os_ * 1e3:.1f} "
        f"ms; the rest (the search): {(co - cs) * 1e3:.1f} ms against {(ol - os_) * 1e3:.1f} ms"
    )
    print(f"olmo-top1[compat]: {same}/{args.batch} identical; top-1 log-probabilities at most {worst:.1e} apart")
    failed |= same != args.batch
    if failed:
        hint = "" if args.float64 else " (a float32 near-tie? see --float64)"
        fail(
            "beamkit (compete policy or beamkit.compat.olmo) and OLMo disagree on some request's top-1 "
            f"hypothesis{hint}"
        )


if __name__ == "__main__":
    main()
