"""What :func:`beamkit.hf.generate` returns: what Hugging Face's ``generate`` returns for the same call.

With ``return_dict_in_generate`` false (Hugging Face's default) that is the ``sequences`` tensor. With it true,
Hugging Face's own output classes, subclassed to carry beamkit's ``hypotheses`` (float64 scores, token
log-probs), the search ``stats`` and ``forward_seconds``: ``sequences``, ``sequences_scores`` (beam search with
``output_scores``, else None, as Hugging Face) and ``beam_indices`` (beam search) in Hugging Face's layout.
Per-step tables (``scores``, ``logits``, attentions, hidden states) are None: the engine keeps no per-step
``[rows, V]`` tables (:func:`beamkit.hf.generate` and ``beamkit.hf.patch`` hand calls that ask for ``scores``
to beamkit's loop, which keeps them in Hugging Face's layout).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers.generation.utils import (
    GenerateBeamDecoderOnlyOutput,
    GenerateBeamEncoderDecoderOutput,
    GenerateDecoderOnlyOutput,
    GenerateEncoderDecoderOutput,
)

from beamkit.hf.bridge.settings import Settings
from beamkit.hypothesis import Hypothesis, SearchStats


@dataclass
class BeamkitExtras:
    """beamkit's fields on Hugging Face's output classes: ``hypotheses``, the search ``stats``,
    ``forward_seconds`` (wall time inside the model's forward calls) and, with ``record_trace=True``, each
    request's search tree (``trace``, :class:`beamkit.trace.Trace`). Listed first among the bases so that these
    fields come after Hugging Face's own."""

    hypotheses: list[list[Hypothesis]] | None = None
    stats: SearchStats | None = None
    forward_seconds: float | None = None
    trace: list[Any] | None = None


@dataclass
class BeamDecoderOnlyOutput(BeamkitExtras, GenerateBeamDecoderOnlyOutput):
    """Hugging Face's beam-search output (decoder-only) plus :class:`BeamkitExtras`."""


@dataclass
class BeamEncoderDecoderOutput(BeamkitExtras, GenerateBeamEncoderDecoderOutput):
    """Hugging Face's beam-search output (encoder-decoder) plus :class:`BeamkitExtras`."""


@dataclass
class GreedyDecoderOnlyOutput(BeamkitExtras, GenerateDecoderOnlyOutput):
    """Hugging Face's greedy output (decoder-only) plus :class:`BeamkitExtras`."""


@dataclass
class GreedyEncoderDecoderOutput(BeamkitExtras, GenerateEncoderDecoderOutput):
    """Hugging Face's greedy output (encoder-decoder) plus :class:`BeamkitExtras`."""


def _chosen(hyps: list[list[Hypothesis]], num_return: int) -> list[Hypothesis | None]:
    """The ``num_return`` best hypotheses of each request, ``None`` where a request has fewer."""
    chosen: list[Hypothesis | None] = []
    for found in hyps:
        got: list[Hypothesis | None] = list(found[:num_return])
        chosen.extend(got + [None] * (num_return - len(got)))
    return chosen


def build_sequences(
    prefix: torch.Tensor, hyps: list[list[Hypothesis]], num_return: int, fill: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack ``prefix[r]`` + each of the ``num_return`` best hypotheses of request r, padded with ``fill``.

    ``prefix`` ``[batch, P]``; the width is ``P`` + the longest returned hypothesis (Hugging Face's crop).
    A request with fewer hypotheses than ``num_return`` gets empty rows scored ``-1e9`` (Hugging Face's
    placeholder score). Returns (sequences, scores float32).
    """
    width_p = prefix.shape[1]
    chosen = _chosen(hyps, num_return)
    gen = max((len(h.tokens) for h in chosen if h is not None), default=0)
    out = torch.full((len(chosen), width_p + gen), fill, dtype=torch.long)  # shape: (batch * n, P + gen)
    out[:, :width_p] = prefix.detach().to("cpu").long().repeat_interleave(num_return, dim=0)
    scores = torch.full((len(chosen),), -1e9, dtype=torch.float32)
    for i, h in enumerate(chosen):
        if h is None:
            continue
        if h.tokens:
            out[i, width_p : width_p + len(h.tokens)] = torch.tensor(h.tokens, dtype=torch.long)
        scores[i] = h.score
    return out.to(prefix.device), scores.to(prefix.device)


def build_beam_indices(hyps: list[list[Hypothesis]], num_return: int, num_beams: int) -> torch.Tensor:
    """Hugging Face's ``beam_indices`` ``[batch * num_return, longest]`` (int32): at each generated step,
    ``request * num_beams + slot`` of the beam the token extended, -1 past a hypothesis' end."""
    chosen = _chosen(hyps, num_return)
    longest = max((len(h.tokens) for h in chosen if h is not None), default=0)
    out = torch.full((len(chosen), longest), -1, dtype=torch.int32)  # shape: (batch * n, longest)
    for i, h in enumerate(chosen):
        if h is not None and h.tokens:
            base = (i // num_return) * num_beams
            out[i, : len(h.tokens)] = torch.tensor([base + b for b in h.beam_indices], dtype=torch.int32)
    return out


def build_output(
    settings: Settings,
    prefix: torch.Tensor,
    hyps: list[list[Hypothesis]],
    stats: SearchStats,
    forward_seconds: float,
    trace: list[Any] | None = None,
) -> Any:
    """The ``sequences`` tensor, or (``return_dict_in_generate``) the output object, as Hugging Face returns."""
    s = settings
    sequences, scores = build_sequences(prefix, hyps, s.num_return, s.fill)
    if not s.return_dict:
        return sequences
    extras: dict[str, Any] = {"hypotheses": hyps, "stats": stats, "forward_seconds": forward_seconds, "trace": trace}
    extras["sequences"] = sequences
    if s.num_beams == 1:
        greedy = GreedyEncoderDecoderOutput if s.encoder_decoder else GreedyDecoderOnlyOutput
        return greedy(**extras)
    extras["sequences_scores"] = scores if s.output_scores else None
    extras["beam_indices"] = build_beam_indices(hyps, s.num_return, s.num_beams).to(prefix.device)
    beam = BeamEncoderDecoderOutput if s.encoder_decoder else BeamDecoderOnlyOutput
    return beam(**extras)
