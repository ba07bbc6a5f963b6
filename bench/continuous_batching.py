"""Continuous batching against static batching and one request at a time, under Poisson arrivals.

Workload: the pretrained g2p-en GRU (numpy, shipped by the ``g2p-en`` package) on CMUdict words, beam 5: output
lengths vary with the word (2-15 phonemes), which is what makes a static batch wait for its slowest member.
Requests arrive as a Poisson process at ``--load`` times the continuous engine's capacity (its requests/s when
every request is there at once), measured first in the same run. The three servers, in one process, in turn:

* **one at a time**: each request decoded alone (``search_batch`` with one request), in arrival order;
* **static**: collect up to ``--batch`` requests or wait ``--wait-ms`` after the first, decode the batch to
  completion (one ``search_batch``), repeat;
* **continuous**: one :class:`beamkit.Engine`; before every step the requests that arrived join (up to
  ``--batch`` running), finished ones leave at once.

Latency is completion minus arrival; throughput is requests over the time from the first arrival to the last
completion. Every request's hypotheses are checked equal across the three. Prints p50 / p99 latency and
requests/s for each, then ``cb-vs-static[throughput]: X.XXx`` and ``cb-vs-static[p99-latency]: X.XXx``
(continuous / static).

    python bench/continuous_batching.py [--requests 300] [--load 0.9] [--batch 32] [--wait-ms 20]
"""

from __future__ import annotations

import argparse
import time
from collections import deque

import numpy as np

from beamkit import Engine, search_batch
from beamkit.models.g2p import BOS, EOS, MAX_LEN, G2PModel
from beamkit.tasks.g2p import sample_words

BEAM, ALPHA = 5, 1.0


def one_at_a_time(model, words, arrivals):
    """Each request alone, in arrival order; returns (finish times, results)."""
    done, out = [], []
    t0 = time.perf_counter()
    for word, at in zip(words, arrivals, strict=True):
        _sleep_until(t0 + at)
        out.append(search_batch(model.step, model.init_state([word]), BOS, EOS, BEAM, MAX_LEN, length_penalty=ALPHA)[0])
        done.append(time.perf_counter() - t0)
    return np.array(done), out


def static(model, words, arrivals, batch, wait):
    """Batches of up to ``batch`` arrived requests (waiting up to ``wait`` s after the first), each to completion."""
    done = np.zeros(len(words))
    out: list = [None] * len(words)
    t0 = time.perf_counter()
    i = 0
    while i < len(words):
        _sleep_until(t0 + arrivals[i])
        deadline = t0 + arrivals[i] + wait
        j = i + 1
        while j < len(words) and j - i < batch:
            now = time.perf_counter()
            if t0 + arrivals[j] <= now:
                j += 1
            elif now >= deadline:
                break
            else:
                _sleep_until(min(t0 + arrivals[j], deadline))
        chunk = words[i:j]
        hyps = search_batch(model.step, model.init_state(chunk), BOS, EOS, BEAM, MAX_LEN, length_penalty=ALPHA)
        end = time.perf_counter() - t0
        done[i:j] = end
        out[i:j] = hyps
        i = j
    return done, out


def continuous(model, words, arrivals, batch):
    """One engine; arrived requests join before each step (up to ``batch`` running)."""
    engine = Engine(model.step, beam_size=BEAM, max_len=MAX_LEN, length_penalty=ALPHA)
    done = np.zeros(len(words))
    out: list = [None] * len(words)
    index: dict[int, int] = {}
    waiting = deque(range(len(words)))
    t0 = time.perf_counter()
    while waiting or not engine.idle:
        now = time.perf_counter() - t0
        while waiting and arrivals[waiting[0]] <= now and engine.running < batch:
            i = waiting.popleft()
            index[engine.add(model.init_state([words[i]]), BOS, EOS)] = i
        if engine.idle:
            _sleep_until(t0 + arrivals[waiting[0]])
            continue
        for c in engine.step():
            i = index.pop(c.request_id)
            done[i] = time.perf_counter() - t0
            out[i] = c.hypotheses
    return done, out


def _sleep_until(t: float) -> None:
    while True:
        left = t - time.perf_counter()
        if left <= 0:
            return
        time.sleep(min(left, 0.001))


def summary(name: str, done: np.ndarray, arrivals: np.ndarray) -> tuple[float, float]:
    lat = (done - arrivals) * 1000
    tput = len(done) / (done.max() - arrivals.min())
    p50, p99 = np.percentile(lat, [50, 99])
    print(f"{name:>14}: {tput:7.1f} req/s  p50 {p50:8.1f} ms  p99 {p99:8.1f} ms")
    return tput, float(p99)


def same(a, b) -> bool:
    return all([h.tokens for h in x] == [h.tokens for h in y] for x, y in zip(a, b, strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--load", type=float, default=0.9, help="arrival rate as a fraction of the engine's capacity")
    ap.add_argument("--batch", type=int, default=32, help="max requests in a static batch / running in the engine")
    ap.add_argument("--wait-ms", type=float, default=20.0, help="static batching: wait after the first request")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    model = G2PModel.load()
    words = [w for w, _ in sample_words(args.requests, seed=args.seed + 1)]
    _, warm = continuous(model, words[:20], np.zeros(20), args.batch)  # warm-up
    cap_done, _ = continuous(model, words, np.zeros(len(words)), args.batch)
    capacity = len(words) / cap_done.max()
    rate = args.load * capacity
    rng = np.random.default_rng(args.seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, size=len(words)))
    arrivals -= arrivals[0]
    print(f"g2p-en, beam {BEAM}, {len(words)} requests; capacity {capacity:.1f} req/s, arrivals {rate:.1f} req/s")
    d1, o1 = one_at_a_time(model, words, arrivals)
    ds, os_ = static(model, words, arrivals, args.batch, args.wait_ms / 1000)
    dc, oc = continuous(model, words, arrivals, args.batch)
    summary("one at a time", d1, arrivals)
    t_s, p_s = summary("static", ds, arrivals)
    t_c, p_c = summary("continuous", dc, arrivals)
    if not (same(o1, oc) and same(os_, oc)):
        raise SystemExit("results differ between the servers")
    print(f"cb-vs-static[throughput]: {t_c / t_s:.2f}x")
    print(f"cb-vs-static[p99-latency]: {p_c / p_s:.2f}x")


if __name__ == "__main__":
    main()
