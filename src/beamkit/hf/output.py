"""What :func:`beamkit.hf.generate` returns, laid out like Hugging Face's ``generate`` output."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from beamkit.hypothesis import Hypothesis, SearchStats
from beamkit.trace import Trace


@dataclass
class BeamOutput:
    """Result of :func:`beamkit.hf.generate`.

    ``sequences`` ``[batch * num_return_sequences, L]`` (LongTensor): prompt + generated tokens for decoder-only
    models, ``decoder_start`` + generated tokens for encoder-decoder models, padded like Hugging Face.
    ``sequences_scores`` ``[batch * num_return_sequences]`` (float32, as Hugging Face): length-normalised scores.
    ``hypotheses``: beamkit's per-request hypotheses (float64 scores, token log-probs, beam indices).
    ``forward_seconds``: wall time spent inside the model's forward (and encoder) calls.
    ``trace``: each request's search tree with ``record_trace=True`` (plain beam search only), else None.
    """

    sequences: torch.Tensor
    sequences_scores: torch.Tensor
    hypotheses: list[list[Hypothesis]]
    stats: SearchStats = field(default_factory=SearchStats)
    forward_seconds: float = 0.0
    trace: list[Trace | None] | None = None

    def __getattr__(self, name: str) -> Any:
        """Hugging Face's per-step outputs are not kept: say so instead of a bare AttributeError."""
        if name in ("scores", "logits", "beam_indices", "attentions", "hidden_states"):
            raise AttributeError(
                f"BeamOutput has no {name!r}: beamkit.hf keeps no per-step [rows, V] tables; hypotheses carry each "
                "token's log-probability (token_logprobs) and beam slot (beam_indices)"
            )
        raise AttributeError(name)


def build_sequences(
    prefix: torch.Tensor, hyps: list[list[Hypothesis]], num_return: int, fill: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack ``prefix[r]`` + each of the ``num_return`` best hypotheses of request r, padded with ``fill``.

    ``prefix`` ``[batch, P]``; the width is ``P`` + the longest returned hypothesis (Hugging Face's crop).
    A request with fewer hypotheses than ``num_return`` gets empty rows scored ``-1e9`` (Hugging Face's
    placeholder score).
    """
    batch, width_p = prefix.shape
    chosen: list[Hypothesis | None] = []
    for r in range(batch):
        got: list[Any] = list(hyps[r][:num_return])
        chosen.extend(got + [None] * (num_return - len(got)))
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
