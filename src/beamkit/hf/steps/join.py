"""States of requests that join the Hugging Face step functions mid-flight (continuous batching).

The engine joins new requests by ``concat_state([running, new1, new2, ...])`` and then makes one ``step_fn``
call for all rows, old and new; the new rows' ``y_prev`` is their ``bos``. Here:

- :class:`Prompt` is the state of requests that have not run yet (``ids`` / ``mask`` ``[n, P]``, one row
  each). Prompts of different widths concatenate by padding with masked columns: on the left for a
  decoder-only prompt (positions come from the mask, so they do not move), on the right for encoder inputs
  (learned absolute positions such as BART's do not move either).
- :class:`Cohorts` is a state made of parts in row order: the running :class:`~beamkit.hf.steps.step.CacheRows`
  and the :class:`Prompt` of the requests that joined. The step functions run each part (a decoding step for a
  cache part, the prompt / encoder for a prompt part) and then: decoder-only, merge the caches into one
  :class:`~beamkit.hf.steps.step.CacheRows`, left-padding the attention masks and position ids with masked columns
  (one forward per step again from the next step on); paged caches (:mod:`beamkit.hf.steps.paged`) join their block
  tables, so nobody's keys/values are copied or re-padded (the padding is the gather's), dense caches left-pad
  the shorter key/value tensors; encoder-decoder, keep the parts
  (a cohort = the requests that joined at one step: one decoder forward per cohort and step, because decoders
  such as BART's take one position for the whole batch, so self-attention caches of different lengths cannot
  share a forward).

A part's rows stay contiguous: the engine keeps rows in request order and a request's rows never move to
another part, so ``beamkit_select`` gathers each part with its own slice of the parents.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def _pad_cols(x: torch.Tensor, width: int, left: bool, value: int = 0) -> torch.Tensor:
    """``x`` ``[n, P]`` widened to ``width`` columns of ``value`` (on the left or the right)."""
    extra = width - x.shape[1]
    if extra <= 0:
        return x
    pad = x.new_full((x.shape[0], extra), value)
    return torch.cat([pad, x] if left else [x, pad], dim=1)


class Prompt:
    """Requests that have not run yet: token ids and attention mask ``[n, P]``, one row per request.

    ``left``: pad on the left when prompts of different widths join (decoder-only prompts), else on the right
    (encoder inputs). Padding columns hold id 0 and mask 0.
    """

    def __init__(self, ids: torch.Tensor, mask: torch.Tensor, left: bool):
        if ids.shape != mask.shape or ids.dim() != 2:
            raise ValueError(f"Prompt needs ids and mask of the same [n, P] shape, got {ids.shape} and {mask.shape}")
        self.ids = ids  # shape: (n, P)
        self.mask = mask  # shape: (n, P)
        self.left = left

    @property
    def rows(self) -> int:
        """Requests (rows) held."""
        return int(self.ids.shape[0])

    def beamkit_select(self, idx: np.ndarray) -> Prompt:
        """The rows ``idx`` (the engine drops cancelled requests before their first call; variants repeat rows)."""
        index = torch.as_tensor(np.asarray(idx, dtype=np.int64), device=self.ids.device)
        return Prompt(self.ids.index_select(0, index), self.mask.index_select(0, index), self.left)

    def beamkit_concat(self, others: list[Any]) -> Prompt:
        """These rows, then the other prompts' rows, padded to the widest."""
        parts = [self, *others]
        if not all(isinstance(p, Prompt) for p in parts):
            raise TypeError(f"a Prompt joins only Prompts, got {[type(p).__name__ for p in parts]}")
        width = max(p.ids.shape[1] for p in parts)
        ids = torch.cat([_pad_cols(p.ids, width, self.left) for p in parts])
        mask = torch.cat([_pad_cols(p.mask, width, self.left) for p in parts])
        return Prompt(ids, mask, self.left)


class Cohorts:
    """A state made of parts in row order (running :class:`~beamkit.hf.steps.step.CacheRows` and joining
    :class:`Prompt` s); see the module docstring."""

    def __init__(self, parts: list[Any]):
        merged: list[Any] = []
        for part in parts:  # consecutive prompts become one
            if merged and isinstance(part, Prompt) and isinstance(merged[-1], Prompt):
                merged[-1] = merged[-1].beamkit_concat([part])
            elif rows_of(part):
                merged.append(part)
        self.parts = merged

    def sizes(self) -> list[int]:
        """Rows of each part."""
        return [rows_of(p) for p in self.parts]

    def beamkit_concat(self, others: list[Any]) -> Cohorts:
        """These parts, then the joining states."""
        return Cohorts([*self.parts, *others])

    def beamkit_select(self, idx: np.ndarray) -> Any:
        """Gather each part with its slice of ``idx`` (parents never cross parts); a single part left is
        returned as it is."""
        idx = np.asarray(idx, dtype=np.int64)
        ends = np.cumsum(self.sizes())
        which = np.searchsorted(ends, idx, side="right")  # shape: (rows,) part of each parent
        if which.size and bool((np.diff(which) < 0).any()):
            raise ValueError("rows of a Hugging Face state must stay in part order (requests in order)")
        parts = []
        for k, part in enumerate(self.parts):
            mine = idx[which == k]
            if mine.size:
                parts.append(part.beamkit_select(mine - (ends[k] - rows_of(part))))
        return parts[0] if len(parts) == 1 else Cohorts(parts)


def rows_of(state: Any) -> int:
    """Rows of a :class:`Prompt`, :class:`~beamkit.hf.steps.step.CacheRows` or :class:`Cohorts`."""
    if isinstance(state, Cohorts):
        return sum(state.sizes())
    if isinstance(state, Prompt):
        return state.rows
    return int(state.row_request.shape[0])
