"""Toy models for the tests: prefix-dependent next-token tables and brute-force oracles.

A toy model's state is an object array of prefixes (one tuple per row), so select_state gathers it like any
array and a test can see exactly which prefix each row holds. The oracles here never call beamkit.
"""

from __future__ import annotations

import hashlib
import itertools
import math

import numpy as np

BOS = -1


def prefix_logits(seed: int, prefix: tuple[int, ...], v: int, scale: float = 3.0) -> np.ndarray:
    """Deterministic pseudo-random logits for ``prefix`` (a hash of seed and prefix seeds the generator)."""
    h = hashlib.sha256(f"{seed}:{prefix}".encode()).digest()
    rng = np.random.default_rng(int.from_bytes(h[:8], "little"))
    return rng.normal(0.0, scale, size=v)


def log_softmax_ref(x: np.ndarray) -> list[float]:
    """Plain-Python log-softmax (an oracle independent of beamkit.ops)."""
    vals = [float(a) for a in x]
    mx = max(vals)
    s = sum(math.exp(a - mx) for a in vals)
    return [a - mx - math.log(s) for a in vals]


class ToyModel:
    """A prefix-dependent model; ``table`` overrides the logits of given prefixes."""

    def __init__(self, v: int, seed: int = 0, table: dict | None = None, scale: float = 3.0, eos_bias: float = 0.0):
        self.v, self.seed, self.table, self.scale = v, seed, table or {}, scale
        self.eos_bias = eos_bias  # added to token 0's logit (eos in the tests) outside the table
        self.calls: list[int] = []
        self.seen: list[tuple[int, ...]] = []

    def logits(self, prefix: tuple[int, ...]) -> np.ndarray:
        if prefix in self.table:
            return np.asarray(self.table[prefix], dtype=np.float64)
        out = prefix_logits(self.seed, prefix, self.v, self.scale)
        out[0] += self.eos_bias
        return out

    def init(self, n: int = 1) -> np.ndarray:
        state = np.empty(n, dtype=object)
        for i in range(n):
            state[i] = ()
        return state

    def step(self, state: np.ndarray, y_prev) -> tuple[np.ndarray, np.ndarray]:
        y = np.asarray(y_prev)
        new = np.empty(len(state), dtype=object)
        for i, (p, t) in enumerate(zip(state, y, strict=True)):
            new[i] = p if int(t) == BOS else p + (int(t),)
        self.calls.append(len(state))
        self.seen.extend(new)
        return np.stack([self.logits(p) for p in new]), new

    def logp(self, prefix: tuple[int, ...], token: int) -> float:
        return log_softmax_ref(self.logits(prefix))[token]

    def path_logprob(self, tokens: list[int]) -> float:
        return sum(self.logp(tuple(tokens[:i]), t) for i, t in enumerate(tokens))


class MultiToy(ToyModel):
    """Several requests: each row's state is (request seed, prefix); request r uses seed ``seeds[r]``."""

    def __init__(self, v: int, seeds: list[int], scale: float = 3.0):
        super().__init__(v, 0, None, scale)
        self.seeds = seeds

    def init(self, n: int | None = None) -> np.ndarray:
        state = np.empty(len(self.seeds), dtype=object)
        for i, s in enumerate(self.seeds):
            state[i] = (s, ())
        return state

    def step(self, state, y_prev):
        y = np.asarray(y_prev)
        new = np.empty(len(state), dtype=object)
        for i, ((s, p), t) in enumerate(zip(state, y, strict=True)):
            new[i] = (s, p if int(t) == BOS else p + (int(t),))
        self.calls.append(len(state))
        return np.stack([prefix_logits(s, p, self.v, self.scale) for s, p in new]), new

    def single(self, r: int) -> ToyModel:
        return ToyModel(self.v, self.seeds[r], scale=self.scale)


def all_outputs(model: ToyModel, eos: int | tuple[int, ...], max_len: int) -> list[tuple[list[int], float, bool]]:
    """Every output of the model: sequences ending in an eos id (length <= max_len) and eos-free ones of max_len."""
    stops = (eos,) if isinstance(eos, int) else tuple(eos)
    out = []
    others = [t for t in range(model.v) if t not in stops]
    for n in range(1, max_len + 1):
        for body in itertools.product(others, repeat=n - 1):
            for e in stops:
                seq = list(body) + [e]
                out.append((seq, model.path_logprob(seq), True))
    for body in itertools.product(others, repeat=max_len):
        seq = list(body)
        out.append((seq, model.path_logprob(seq), False))
    return out
