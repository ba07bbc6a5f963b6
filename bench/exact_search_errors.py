"""Search errors of beam search against exact search on a toy model (Stahlberg & Byrne 2019).

PYTHONPATH=src:. python bench/exact_search_errors.py
"""

import time

import numpy as np
from tests.test_exact import BOS, toy

from beamkit.variants import search_errors

vocab, eos, max_len, n_req = 6, 5, 7, 20
step, _ = toy(vocab, 0, sharp=1.0, max_len=max_len)
init = np.arange(n_req, dtype=np.int64)[:, None]
for alpha in (0.0, 1.0):
    for k in (1, 2, 5, 10):
        t0 = time.perf_counter()
        rep = search_errors(step, init, BOS, eos, k, max_len, length_penalty=alpha)
        dt = time.perf_counter() - t0
        print(
            f"alpha={alpha} beam={k:2d}: search errors {rep.errors}/{rep.total}; exact rows {rep.exact_rows} "
            f"vs full enumeration {rep.full_rows} ({rep.exact_rows / rep.full_rows:.2%}); {dt:.1f}s"
        )
