"""A toy model for the server tests: numpy logits from a per-row seed, joinable at any step, with faults on demand.

Prompts are lowercase letters. Every row's state is its own (``seed``, ``pos``), so requests may join a running
engine at any step. A prompt containing ``nan`` gives its rows NaN logits from ``nan_at`` generated tokens on;
``delay`` seconds of sleep per step make requests slow enough to be caught running. ``calls`` records the rows
of every step and ``inits`` every prompt that reached ``init_state``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from beamkit.adapters import ModelAdapter

LETTERS = "abcdefgh"
BOS, EOS = 0, 1
V = 2 + len(LETTERS)


def toy_logits(seed: np.ndarray, pos: np.ndarray, y_prev: np.ndarray) -> np.ndarray:
    """Deterministic logits ``[rows, V]``: a smooth function of each row's seed, position and last token."""
    k = np.arange(V)[None, :]
    out = 3.0 * np.sin(seed[:, None] * (k + 1) + 0.7 * pos[:, None] + 0.31 * y_prev[:, None] * (k + 2))
    out[:, EOS] += 0.25 * pos  # shape: (rows, V), eos grows likelier with length
    out[:, BOS] = -np.inf
    return out


class ToyAdapter(ModelAdapter):
    """The toy model as the server drives it."""

    def __init__(self, delay: float = 0.0, nan_at: int = 2, name: str = "toy", max_prompt: int = 32):
        self.name, self.delay, self.nan_at = name, delay, nan_at
        self.bos, self.eos = BOS, (EOS,)
        self.default_max_tokens, self.max_tokens_limit, self.max_prompt_tokens = 12, 400, max_prompt
        self.calls: list[int] = []
        self.inits: list[tuple[int, ...]] = []

    def step_fn(self, state: Any, y_prev: Any) -> Any:
        """Logits for every row; NaN rows for poisoned prompts past ``nan_at``."""
        seed, pos, poison = state
        self.calls.append(int(seed.shape[0]))
        if self.delay:
            time.sleep(self.delay)
        y = np.asarray(y_prev, dtype=np.int64)
        logits = toy_logits(seed, pos, y)
        logits[(poison > 0) & (pos >= self.nan_at)] = np.nan
        return logits, (seed, pos + 1, poison)

    def encode(self, prompt: str) -> list[int]:
        """Letters a-h; 'n' is allowed to spell the poison word; anything else is refused."""
        bad = sorted(set(prompt) - set(LETTERS) - set("n"))
        if bad or not prompt:
            raise ValueError(f"the toy model reads the letters {LETTERS!r}, got {prompt!r}")
        return [2 + LETTERS.index(ch) if ch in LETTERS else V for ch in prompt]

    def init_state(self, prompts: list[list[int]]) -> Any:
        """One row per prompt: a seed from the prompt, position 0, the poison flag."""
        self.inits.extend(tuple(ids) for ids in prompts)
        seed = [sum((i + 1) * 0.137 * t for i, t in enumerate(ids)) for ids in prompts]
        poison = [1.0 if "nan" in self.decode_prompt(ids) else 0.0 for ids in prompts]
        return (np.array(seed), np.zeros(len(prompts), np.int64), np.array(poison))

    @staticmethod
    def decode_prompt(ids: list[int]) -> str:
        """The prompt text of ``ids``."""
        return "".join("n" if t == V else LETTERS[t - 2] for t in ids)

    def decode(self, tokens: list[int]) -> str:
        """Letters up to eos."""
        out = []
        for t in tokens:
            if t == EOS:
                break
            out.append(LETTERS[t - 2])
        return "".join(out)

    def token_text(self, token: int) -> str:
        """One letter, or <eos>."""
        return "<eos>" if token == EOS else LETTERS[token - 2]

    @contextlib.contextmanager
    def step_context(self) -> Iterator[None]:
        """Nothing to set up for numpy."""
        yield


def toy_alone(
    prompt: str, beam: int, n: int, max_tokens: int, alpha: float = 1.0, min_len: int = 0
) -> list[tuple[str, float]]:
    """The oracle: the prompt decoded alone by :func:`beamkit.search_batch` (text and logprob of the n-best)."""
    from beamkit import search_batch

    toy = ToyAdapter()
    state = toy.init_state([toy.encode(prompt)])
    hyps = search_batch(
        toy.step_fn, state, BOS, EOS, beam, max_tokens, length_penalty=alpha, num_return=n, min_len=min_len
    )
    return [(toy.decode(h.tokens), h.logprob) for h in hyps[0]]
