"""Every private ``transformers`` member beamkit's decoding loop (:mod:`beamkit.hf.loop`) touches, in one place.

The loop runs inside Hugging Face's own ``generate`` and does what its decoding methods do, so it calls some of
their helpers that ``transformers`` does not publish: the prefill, the model-keyword update after a forward, the
stop check across processes, the cache reorder, the compile check and the decode-time optimisation, the
generation config's prepared token tensors, the output classes and cache names of ``generation/utils.py``, and
what a ``PrefixConstrainedLogitsProcessor`` holds.
Each is reached through one function here, so a ``transformers`` release that renames one changes this module
only (the releases tested are :data:`beamkit.hf.versions.TESTED_TRANSFORMERS`; names that differ between them
are resolved in :mod:`beamkit.hf.versions`).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any


def prefill(model: Any, input_ids: Any, config: Any, kwargs: dict[str, Any], first: bool) -> Any:
    """The first forward over the whole prompt (``GenerationMixin._prefill``: chunking, embeddings, a given
    cache's offset)."""
    return model._prefill(input_ids, config, kwargs, is_first_iteration=first)


def update_model_kwargs(model: Any, outputs: Any, kwargs: dict[str, Any], encoder_decoder: bool) -> dict[str, Any]:
    """The model keywords after a forward: its cache, masks and positions
    (``GenerationMixin._update_model_kwargs_for_generation``)."""
    updated: dict[str, Any] = model._update_model_kwargs_for_generation(
        outputs, kwargs, is_encoder_decoder=encoder_decoder
    )
    return updated


def has_unfinished(model: Any, finished: bool, synced_gpus: bool, device: Any) -> bool:
    """Whether to run another step; with ``synced_gpus``, until every process is done
    (``GenerationMixin._has_unfinished_sequences``)."""
    return bool(model._has_unfinished_sequences(finished, synced_gpus, device=device))


def cache_names() -> tuple[str, ...]:
    """The model keywords a key/value cache may be held under (``generation.utils.ALL_CACHE_NAMES``)."""
    from transformers.generation.utils import ALL_CACHE_NAMES

    return tuple(ALL_CACHE_NAMES)


def output_class(kind: str, encoder_decoder: bool) -> Any:
    """Hugging Face's output class of ``kind`` (``"Generate"`` or ``"GenerateBeam"``) for a decoder-only or an
    encoder-decoder model (``generation.utils.GenerateBeamEncoderDecoderOutput`` and its siblings)."""
    from transformers.generation import utils

    return getattr(utils, f"{kind}{'EncoderDecoder' if encoder_decoder else 'DecoderOnly'}Output")


def pad_token_tensor(generation_config: Any) -> Any:
    """The pad id as ``generate`` prepared it on the config (``GenerationConfig._pad_token_tensor``), or None."""
    return generation_config._pad_token_tensor


def eos_token_tensor(generation_config: Any) -> Any:
    """The stop ids as ``generate`` prepared them on the config (``GenerationConfig._eos_token_tensor``), or
    None."""
    return generation_config._eos_token_tensor


def auto_compiles(model: Any, kwargs: dict[str, Any], generation_config: Any) -> bool:
    """Whether Hugging Face would run this call's forwards compiled
    (``GenerationMixin._valid_auto_compile_criteria``)."""
    return bool(model._valid_auto_compile_criteria(kwargs, generation_config))


def optimized_for_decode(model: Any) -> AbstractContextManager[Any]:
    """What Hugging Face's decoding methods run their steps under (``GenerationMixin._optimize_model_for_decode``)."""
    manager: AbstractContextManager[Any] = model._optimize_model_for_decode()
    return manager


def reorder_cache(model: Any) -> Any:
    """The model's own cache reorder for beam search (``PreTrainedModel._reorder_cache``, legacy models), or
    None: the cache reorders itself."""
    return getattr(model, "_reorder_cache", None)


def prefix_constraint(processor: Any) -> tuple[Any, int] | None:
    """A ``PrefixConstrainedLogitsProcessor``'s function and beam count (its ``_prefix_allowed_tokens_fn`` and
    ``_num_beams``), None for any other processor."""
    fn = getattr(processor, "_prefix_allowed_tokens_fn", None)
    return None if fn is None else (fn, int(processor._num_beams))


def attention_name(config: Any) -> Any:
    """The attention function a model's config names (``PretrainedConfig._attn_implementation``), or None."""
    return getattr(config, "_attn_implementation", None)


def attending_with(config: Any, name: str) -> Any:
    """A copy of ``config`` that names the attention function ``name`` (its ``_attn_implementation_internal``);
    ``config`` itself is left as it is."""
    import copy

    renamed = copy.copy(config)
    renamed._attn_implementation_internal = name
    return renamed


def same_but_attention(a: Any, b: Any) -> bool:
    """Whether two configs hold the same settings, the attention function they name aside."""

    def settings(config: Any) -> dict[str, Any]:
        return {k: v for k, v in vars(config).items() if k != "_attn_implementation_internal"}

    return settings(a) == settings(b)


def register_attention(name: str, function: Any) -> None:
    """Put ``function`` in ``transformers``' attention registry under ``name``, once
    (``AttentionInterface._global_mapping``)."""
    from transformers import AttentionInterface

    if name not in AttentionInterface._global_mapping:
        AttentionInterface.register(name, function)
