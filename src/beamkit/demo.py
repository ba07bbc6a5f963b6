"""The worked example of the exact beam-search contract: a table of next-token probabilities where beam beats greedy."""

from __future__ import annotations

from typing import Any

import numpy as np

EOS, A, B = 0, 1, 2
NAMES = {EOS: "eos", A: "a", B: "b"}
DEMO_PROBS = {(): [0.1, 0.5, 0.4], (A,): [0.2, 0.1, 0.7], (B,): [0.9, 0.05, 0.05]}


def table_step(state: np.ndarray, y_prev: Any) -> tuple[np.ndarray, np.ndarray]:
    """Step function of the worked example: a table of next-token probabilities by prefix."""
    y = np.asarray(y_prev)
    new = np.empty(len(state), dtype=object)
    for i, (prefix, tok) in enumerate(zip(state, y, strict=True)):
        new[i] = prefix if tok < 0 else prefix + (int(tok),)
    # shape: (rows, 3) logits (log-probabilities here)
    logits = np.log(np.array([DEMO_PROBS.get(p, [1 / 3] * 3) for p in new]))
    return logits, new
