"""A small toy model for examples (the README's) and quick experiments: numpy only, deterministic.

``step_fn(state, y_prev)`` is a prefix-dependent model over ``VOCAB`` tokens (``EOS`` = 0): each row's state is
``[h, length]``, where ``h`` is one of ``HIDDEN`` states updated from the previous token (``h * 31 + token + 1``
modulo ``HIDDEN``); the logits are a fixed random table's row ``h`` with eos raised by ``EOS_RISE`` per token
generated, so outputs end after a few tokens. Ready to use::

    from beamkit import search_batch
    from beamkit.toy import batch_state, bos, eos, state, step_fn

    hyps = search_batch(step_fn, batch_state, bos, eos, beam_size=4, max_len=10)

``state`` is one request, ``batch_state`` eight; :func:`make_state` builds any number.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from beamkit._checks import check_int

VOCAB = 50
HIDDEN = 97
EOS = 0
BOS = -1
EOS_RISE = 2.0
SEED = 0

# shape: (HIDDEN, VOCAB) the logits of each hidden state; scale 4 keeps the distributions peaked but not trivial
TABLE = np.random.default_rng(SEED).normal(0.0, 4.0, size=(HIDDEN, VOCAB))


def make_state(requests: int = 1, seed: int = SEED) -> np.ndarray:
    """Initial state of ``requests`` requests (different start states; row r of seed s is always the same)."""
    requests = check_int("requests", requests, 1)
    state = np.zeros((int(requests), 2), dtype=np.int64)  # shape: (rows, 2): hidden state, tokens generated
    state[:, 0] = (np.arange(requests) * 7 + seed) % HIDDEN
    return state


def step_fn(state: np.ndarray, y_prev: Any) -> tuple[np.ndarray, np.ndarray]:
    """One step for every row: ``(logits [rows, VOCAB], new_state)``; ``y_prev`` is ``BOS`` on the first call."""
    if not isinstance(state, np.ndarray) or state.ndim != 2 or state.shape[1] != 2:
        raise TypeError(f"the toy model's state is an int array [rows, 2] (see make_state), got {state!r}")
    y = np.asarray(y_prev, dtype=np.int64)  # shape: (rows,)
    if y.shape != (state.shape[0],):
        raise ValueError(f"y_prev must hold one token per row ({state.shape[0]}), got shape {y.shape}")
    started = y >= 0
    new = state.copy()
    new[:, 0] = np.where(started, (state[:, 0] * 31 + y + 1) % HIDDEN, state[:, 0])
    new[:, 1] = state[:, 1] + started
    logits = TABLE[new[:, 0]].copy()  # shape: (rows, VOCAB)
    logits[:, EOS] += EOS_RISE * new[:, 1]
    return logits, new


bos, eos = BOS, EOS
state = make_state(1)
batch_state = make_state(8)
