"""The records of the CTC prefix beam search's frame loop: beams, rows and merged rows (numpy record dtypes),
completed words' frames, the storage the loop works in (:class:`Store`), a batch's candidates
(:class:`FrameInput`), the scalar settings (:class:`Knobs`), and the codes it reports (fates, results,
counters)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

BEAM = np.dtype(
    [
        ("node", np.int64),  # the prefix
        ("pb", np.float64),  # log-prob of its alignments ending in blank
        ("pnb", np.float64),  # ... ending in its last label
        ("ps", np.int64),  # first frame of the partial word (-1: none)
        ("pe", np.int64),  # frame after its last label
        ("wf", np.int64),  # last completed word's frames in the word records (-1: none)
    ]
)
ROW = np.dtype(
    [
        ("src", np.int64),  # the beam extended
        ("tok", np.int64),  # by this label
        ("node", np.int64),  # giving this prefix
        ("val", np.float64),  # with this log-prob
        ("stay", np.bool_),  # the prefix stayed (blank, or the last label repeated)
        ("nb", np.bool_),  # the alignment ends in a label
    ]
)
MERGED = np.dtype(
    [
        ("rep", np.int64),  # the most probable row (the first on ties): the beam's history
        ("node", np.int64),
        ("nb", np.bool_),  # with split_blank: the beam ends in a label
        ("pb", np.float64),
        ("pnb", np.float64),
        ("total", np.float64),  # logaddexp(pb, pnb) + the prefix's fused score
        ("best", np.float64),  # the rep row's log-prob
        ("n", np.int64),  # rows merged
        ("fate", np.int8),  # KEPT, or the pruning that dropped it
        ("slot", np.int64),  # its slot in the merge table
        ("label", np.int64),  # the label the rep row added (-1: the prefix stayed)
    ]
)
RECORD = np.dtype([("start", np.int64), ("end", np.int64), ("prev", np.int64)])  # a completed word's frames


class Store(NamedTuple):
    """The storage the frame loop reads and writes (built by ``beamkit.ctc.prefix.run.Workspace``, again whenever
    an array grows)."""

    nodes: np.ndarray  # shape: (capacity,) NODE: the prefix store
    whist: np.ndarray  # shape: (capacity, history) uint64: each node's last words' hashes
    ek: np.ndarray  # shape: (slots,) int64: edge map keys (parent * V + label)
    ev: np.ndarray  # shape: (slots,) int64: edge map values (child node)
    recs: np.ndarray  # shape: (capacity,) RECORD: completed words' frames
    pend: np.ndarray  # shape: (rows,) PENDING: LM queries to answer
    cnt: np.ndarray  # shape: (8,) int64: the counters N_*
    beams: np.ndarray  # shape: (width,) BEAM: the beams
    nxt: np.ndarray  # shape: (width,) BEAM: the next frame's beams
    rows: np.ndarray  # shape: (rows,) ROW: a frame's rows
    merged: np.ndarray  # shape: (rows,) MERGED: the rows merged by prefix
    mslot: np.ndarray  # shape: (slots,) int64: the merge table (-1: free)
    order: np.ndarray  # shape: (rows,) int64: the merged beams' ranking
    scratch: np.ndarray  # shape: (3, rows) int64: working space


class FrameInput(NamedTuple):
    """The candidate labels of every frame of a batch (see ``beamkit.ctc.posteriors.FrameCandidates``)."""

    offsets: np.ndarray  # shape: (N * T + 1,) int64: row r's candidates are [offsets[r], offsets[r + 1])
    labels: np.ndarray  # shape: (C,) int64
    values: np.ndarray  # shape: (C,) float64: their log-probabilities


class Knobs(NamedTuple):
    """The scalar settings of one search."""

    width: int  # beam width
    blank: int  # the blank's label
    V: int  # labels
    split: bool  # pyctcdecode's beam unit (see CTCOptions.split_blank)
    history: bool  # prune by history
    frames: bool  # record word frames
    trace: bool  # stop after every frame for a recorder
    prune_logp: float  # the beam threshold


# fates
KEPT, BY_THRESHOLD, BY_WIDTH, BY_HISTORY = 0, 1, 2, 3
# run_frames results
DONE, NEED_LM, NEED_NODES, NEED_EDGES, NEED_RECORDS, FRAME = 0, 1, 2, 3, 4, 5
# counters
N_NODES, N_EDGES, N_RECORDS, N_PENDING, N_BEAMS, N_MERGED, N_KEPT = 0, 1, 2, 3, 4, 5, 6
