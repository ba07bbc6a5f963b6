"""The few array operations the search needs, for numpy and torch.

The engine never calls numpy or torch directly on model outputs: it goes through these functions, so a backend
is one place. Work on ``[rows, V]`` arrays stays in the logits' own library and device; only ``[rows, m]``
candidate tables (m = a few times the beam size) and ``[rows]`` vectors come back to the host as numpy.
torch is imported lazily: numpy users never load it.

One module per idea: :mod:`~beamkit.ops.backend` (library, device, host copies), :mod:`~beamkit.ops.chunks`
(how large tables are walked), :mod:`~beamkit.ops.normalize` (log-sum-exp, log-softmax), :mod:`~beamkit.ops.gather`
(reading entries), :mod:`~beamkit.ops.masks` (writing entries), :mod:`~beamkit.ops.top` (top-m with the tie rule),
:mod:`~beamkit.ops.sampling` (noise and draws); the names are re-exported here.
"""

from beamkit.ops.backend import (
    NEG_INF,
    check_logits,
    cpu_view,
    dtype_kind,
    inference_mode,
    is_array,
    is_torch,
    like,
    set_torch_threads,
    to_library,
    to_numpy,
    torch_threads,
    torch_threads_set,
)
from beamkit.ops.gather import (
    concat_rows,
    copy,
    div_rows,
    gather_cols,
    gather_rows,
    left_pad,
    pick,
    plus_offset64,
    row_max,
    row_min,
    take_cols,
)
from beamkit.ops.masks import add_at, fill, keep_only, keep_pairs, mask_below, penalize_at, where_cols
from beamkit.ops.normalize import log_softmax, logsumexp
from beamkit.ops.sampling import cumsum_exp, gumbel, inverse_cdf, is_generator, nucleus_size, sort_desc, uniform
from beamkit.ops.top import device_lse_and_top, top_candidates

__all__ = [
    "NEG_INF",
    "add_at",
    "check_logits",
    "concat_rows",
    "copy",
    "cpu_view",
    "cumsum_exp",
    "device_lse_and_top",
    "div_rows",
    "dtype_kind",
    "fill",
    "gather_cols",
    "gather_rows",
    "gumbel",
    "inference_mode",
    "inverse_cdf",
    "is_array",
    "is_generator",
    "is_torch",
    "keep_only",
    "keep_pairs",
    "left_pad",
    "like",
    "log_softmax",
    "logsumexp",
    "mask_below",
    "nucleus_size",
    "penalize_at",
    "pick",
    "plus_offset64",
    "row_max",
    "row_min",
    "set_torch_threads",
    "sort_desc",
    "take_cols",
    "to_library",
    "to_numpy",
    "top_candidates",
    "torch_threads",
    "torch_threads_set",
    "uniform",
    "where_cols",
]
