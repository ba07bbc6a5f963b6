"""Step functions over a Hugging Face model's forward pass and its ``Cache``.

The engine calls ``step(state, y_prev) -> (logits [rows, V], state)``. A request starts with one row, so the
prompt (decoder-only) or the encoder input (encoder-decoder) is run once per request, not ``num_beams`` times.
After that, one token per live row goes through the model with the key/value cache. The cache is wrapped in
:class:`CacheRows`, whose ``beamkit_select`` gathers the cache rows by parent; the engine only calls it when the
parents are not the identity, and rows of finished requests are dropped by the same gather.

Everything here needs torch; the module is only imported when the Hugging Face bridge is used.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch
from transformers.modeling_outputs import BaseModelOutput

from beamkit.state import Shared


class CacheRows:
    """A Hugging Face ``Cache`` that ``beamkit.select_state`` can gather by parent row.

    For an encoder-decoder cache the cross-attention keys/values depend only on the request, so they are
    gathered only when the row -> request layout changes (a request's first expansion, a request leaving);
    while every request keeps its beams, only the self-attention cache is gathered.
    """

    def __init__(self, cache: Any, row_request: np.ndarray):
        self.cache = cache
        self.row_request = row_request  # shape: (rows,) request of each cache row

    def beamkit_select(self, idx: np.ndarray) -> CacheRows:
        """Gather the cache rows ``idx`` (parents; rows may repeat or disappear), in place, and return self."""
        index = torch.as_tensor(idx, dtype=torch.long)
        new_request = self.row_request[idx]
        self_cache = getattr(self.cache, "self_attention_cache", None)
        cross_cache = getattr(self.cache, "cross_attention_cache", None)
        if self_cache is not None and cross_cache is not None:
            self_cache.reorder_cache(index)
            if not np.array_equal(new_request, self.row_request):
                cross_cache.reorder_cache(index)
        elif hasattr(self.cache, "reorder_cache"):
            self.cache.reorder_cache(index)
        else:
            raise TypeError(f"{type(self.cache).__name__} cannot be reordered for beam search (no reorder_cache)")
        self.row_request = new_request
        return self


def _accepts(model: Any, name: str) -> bool:
    """Whether ``model.forward`` takes the keyword ``name``."""
    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


class DecoderOnlyStep:
    """Step function for a decoder-only model (GPT-2, Llama-style), left-padded prompts.

    State: ``{"mask": [rows, L] attention mask, "pos": [rows] last position id, "cache": CacheRows | None,
    "ids": [rows, P] prompt (first call only)}``. Position ids follow Hugging Face's generate: the cumulative
    sum of the attention mask minus one (0 on padding), then +1 per generated token.
    """

    def __init__(self, model: Any):
        self.model = model
        self.keep_one = _accepts(model, "logits_to_keep")
        self.takes_pos = _accepts(model, "position_ids")
        self.forward_seconds = 0.0  # time spent inside the model forward (benchmarks read it)

    def init_state(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, Any]:
        """The engine's initial state: one row per request."""
        return {"mask": attention_mask.long(), "ids": input_ids, "pos": None, "cache": None}

    def __call__(self, state: dict[str, Any], y_prev: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        mask = state["mask"]  # shape: (rows, L)
        kwargs: dict[str, Any] = {"use_cache": True, "return_dict": True}
        if state["cache"] is None:
            ids = state["ids"]  # shape: (rows, P)
            pos = mask.cumsum(-1) - 1
            pos = pos.masked_fill(mask == 0, 0)  # shape: (rows, P)
            rows = ids.shape[0]
            if self.keep_one:
                kwargs["logits_to_keep"] = 1
        else:
            ids = torch.as_tensor(y_prev, dtype=torch.long).view(-1, 1)  # shape: (rows, 1)
            rows = ids.shape[0]
            mask = torch.cat([mask, mask.new_ones((rows, 1))], dim=1)
            pos = (state["pos"] + 1).view(-1, 1)  # shape: (rows, 1)
            kwargs["past_key_values"] = state["cache"].cache
        if self.takes_pos:
            kwargs["position_ids"] = pos
        with torch.inference_mode():
            clock = _Clock(self)
            out = self.model(input_ids=ids, attention_mask=mask, **kwargs)
            clock.stop()
            logits = out.logits[:, -1, :]  # shape: (rows, V)
            if logits.dtype != torch.float32:
                logits = logits.float()
        cache = state["cache"]
        if cache is None:
            cache = CacheRows(out.past_key_values, np.arange(rows, dtype=np.int64))
        else:
            cache.cache = out.past_key_values
        return logits, {"mask": mask, "pos": pos[:, -1], "cache": cache}


class EncoderDecoderStep:
    """Step function for an encoder-decoder model (T5, BART, Marian).

    The encoder runs once per request on the first call. Its output is not copied per beam: the decoder reads
    it through the cross-attention cache, filled at the first decoder step from one row per request; later
    steps pass a zero-copy broadcast view where the model only needs its shape. State: ``{"mask": [rows, S]
    encoder attention mask, "ids": [rows, S] input (first call only), "enc": encoder output or None,
    "cache": CacheRows | None}``.
    """

    def __init__(self, model: Any):
        self.model = model
        self.forward_seconds = 0.0

    def init_state(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, Any]:
        """The engine's initial state: one row per request."""
        return {"mask": attention_mask.long(), "ids": input_ids, "enc": Shared(None), "cache": None}

    def __call__(self, state: dict[str, Any], y_prev: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        mask = state["mask"]  # shape: (rows, S)
        dec = torch.as_tensor(y_prev, dtype=torch.long).view(-1, 1)  # shape: (rows, 1)
        rows = dec.shape[0]
        kwargs: dict[str, Any] = {"use_cache": True, "return_dict": True}
        with torch.inference_mode():
            clock = _Clock(self)
            enc = state["enc"].value
            if enc is None:
                encoder = self.model.get_encoder()
                enc = encoder(input_ids=state["ids"], attention_mask=mask, return_dict=True).last_hidden_state
                hidden = enc  # shape: (rows, S, d), one row per request
            else:
                kwargs["past_key_values"] = state["cache"].cache
                # Cross-attention keys/values come from the cache; the model only needs the batch shape.
                hidden = enc[:1].expand(rows, -1, -1)  # shape: (rows, S, d) view, no copy
            out = self.model(
                encoder_outputs=BaseModelOutput(last_hidden_state=hidden),
                attention_mask=mask,
                decoder_input_ids=dec,
                **kwargs,
            )
            clock.stop()
            logits = out.logits[:, -1, :]  # shape: (rows, V)
            if logits.dtype != torch.float32:
                logits = logits.float()
        cache = state["cache"]
        if cache is None:
            cache = CacheRows(out.past_key_values, np.arange(rows, dtype=np.int64))
            _check_cross_cache(out.past_key_values)
        else:
            cache.cache = out.past_key_values
        return logits, {"mask": mask, "enc": Shared(enc), "cache": cache}


def _check_cross_cache(cache: Any) -> None:
    """Raise unless the model keeps cross-attention keys/values in an ``EncoderDecoderCache``."""
    cross = getattr(cache, "cross_attention_cache", None)
    if cross is None or cross.get_seq_length() == 0:
        raise TypeError(
            "beamkit.hf needs an encoder-decoder model that caches cross-attention keys/values "
            f"(EncoderDecoderCache); got {type(cache).__name__}"
        )


class _Clock:
    """Adds the wall time between creation and ``stop()`` to ``owner.forward_seconds``."""

    def __init__(self, owner: Any):
        import time

        self._time = time.perf_counter
        self.owner = owner
        self.start = self._time()

    def stop(self) -> None:
        self.owner.forward_seconds += self._time() - self.start
