"""The engine bridge: one ``generate`` call checked and prepared (:func:`prepare`), then decoded on beamkit's engine
with the bridge's step functions (:class:`Prepared`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from beamkit.constraints import check_vocab
from beamkit.hf.bridge.inputs import attention_mask_for, check_input_ids, check_model, output_size
from beamkit.hf.bridge.output import build_output
from beamkit.hf.bridge.processors import build_processors
from beamkit.hf.bridge.search import run_search
from beamkit.hf.bridge.settings import Settings, is_generation_config, merge_config, resolve
from beamkit.hf.errors import Unsupported
from beamkit.hf.steps.paged import BLOCK_SIZE
from beamkit.hf.steps.step import DecoderOnlyStep, EncoderDecoderStep


def prepare(
    model: Any, inputs: Any, attention_mask: Any, kwargs: dict[str, Any], exact_only: bool, merged: Any = None
) -> Any:
    """The engine bridge's decoding of one call, checked and ready to run (a callable). Raises
    :class:`Unsupported` for calls the bridge does not take: a model with its own ``generate`` (Whisper), no
    ``input_ids`` (``inputs_embeds``, or nothing), models whose inputs are not token ids, and settings it does
    not reproduce; with ``exact_only``
    also per-step score tables (``output_scores`` with ``return_dict_in_generate``) and sampling (beamkit's
    bridge draws from its own noise, not from Hugging Face's RNG stream). ValueError / TypeError for bad input.
    The bridge itself returns no per-step tables (``scores`` is None). ``merged``: the call's generation config
    as :func:`~beamkit.hf.bridge.settings.merge_config` returns it, where the caller merged it already."""
    kwargs = dict(kwargs)
    check_model(model)
    own = getattr(type(model), "generate", None)
    if own is not None and own is not _mixin_generate():
        raise Unsupported(f"{type(model).__name__} has a generate of its own")
    for name in ("inputs", "input_ids"):
        if name in kwargs:
            if inputs is not None:
                raise TypeError(f"generate() got the inputs twice (positional and {name}=)")
            inputs = kwargs.pop(name)
    if inputs is None:
        raise Unsupported("no input_ids")
    if getattr(model, "main_input_name", "input_ids") != "input_ids":
        raise Unsupported(f"inputs other than token ids ({model.main_input_name})")
    if is_generation_config(attention_mask):  # Hugging Face's second positional argument
        if "generation_config" in kwargs:
            raise TypeError("generate() got generation_config twice")
        kwargs["generation_config"], attention_mask = attention_mask, None
    if "attention_mask" in kwargs:
        if attention_mask is not None:
            raise TypeError("generate() got attention_mask twice")
        attention_mask = kwargs.pop("attention_mask")
    passed = kwargs.pop("generation_config", None)
    if merged is None:
        merged = merge_config(passed, getattr(model, "generation_config", None), kwargs)
    gc, rest, given = merged[0], dict(merged[1]), merged[2]
    input_ids = check_input_ids(inputs, model)
    settings = resolve(model, gc, rest, given, input_ids.shape[1])
    if settings.allowed_output is not None:
        from beamkit.hf.retrieval.allowed import check_head

        check_head(model)
    if exact_only and wants_tables(settings):
        raise Unsupported("output_scores=True with return_dict_in_generate: per-step scores come from the loop")
    if exact_only and settings.do_sample:
        raise Unsupported("do_sample=True: beamkit samples from its own noise, not Hugging Face's RNG stream")
    return Prepared(model, *rows_to_decode(input_ids, attention_mask, settings, output_size(model)))


def rows_to_decode(input_ids: Any, attention_mask: Any, settings: Settings, width: int | None) -> tuple[Any, ...]:
    """A resolved call's rows, checked against the model's output width ``width`` (a dictionary's ids, the eos
    ids; None: not known): the prompts, their attention mask and the settings to decode them with. Sampling with
    ``num_return_sequences=n`` and one beam decodes each prompt n times, as n rows side by side, as Hugging Face
    does. Shared by every bridge that reads a call as Hugging Face does (``beamkit.openvino`` too)."""
    if settings.prefix_fn is not None and width is not None:
        check_vocab(settings.prefix_fn.trie, width, "the prefix_allowed_tokens_fn's dictionary")
    outside = [e for e in settings.eos if e < 0 or width is not None and e >= width]
    if outside:  # Hugging Face warns and never stops on them
        raise Unsupported(f"eos ids {outside} outside the model's output")
    mask = attention_mask_for(input_ids, attention_mask, settings.pad, settings.eos)
    if settings.do_sample and settings.num_beams == 1 and settings.num_return > 1:
        input_ids = input_ids.repeat_interleave(settings.num_return, dim=0)  # shape: (B * n, P)
        mask = mask.repeat_interleave(settings.num_return, dim=0)  # shape: (B * n, P)
        settings = replace(settings, num_return=1)
    return input_ids, mask, settings


def wants_tables(settings: Settings) -> bool:
    """Whether a call asks for Hugging Face's per-step ``scores`` (``output_scores`` with
    ``return_dict_in_generate``): ``[batch * beams, V]`` tables in Hugging Face's row layout, finished requests
    included, which beamkit's loop keeps and the engine's compact rows do not."""
    return settings.return_dict and settings.output_scores


def loop_decodes(settings: Settings) -> bool:
    """Whether beamkit's loop inside Hugging Face's ``generate`` takes a call with these settings: one of Hugging
    Face's own modes (not diverse or constrained beam search, which Hugging Face 5.x no longer ships) and no
    beamkit search options (Hugging Face's ``generate`` takes none)."""
    return settings.groups == 1 and not settings.force_words and not settings.search_options


@dataclass(frozen=True)
class Prepared:
    """One call checked for the engine bridge: its left-padded ``input_ids`` / ``mask`` ``[B, P]`` and
    resolved settings; calling it decodes on beamkit's engine."""

    model: Any
    input_ids: torch.Tensor  # shape: (B, P)
    mask: torch.Tensor  # shape: (B, P)
    settings: Settings

    def __call__(self) -> Any:
        return _decode(self.model, self.input_ids, self.mask, self.settings)


def _mixin_generate() -> Any:
    from transformers import GenerationMixin

    return GenerationMixin.generate


def _decode(model: Any, input_ids: torch.Tensor, mask: torch.Tensor, settings: Settings) -> Any:
    """Run one prepared call on beamkit's engine."""
    batch = input_ids.shape[0]
    step: DecoderOnlyStep | EncoderDecoderStep
    if settings.encoder_decoder:
        prefix = torch.full((batch, 1), settings.start, dtype=torch.long, device=input_ids.device)
        step = EncoderDecoderStep(model, compile=settings.compile or False)
    else:
        prefix = input_ids
        blocks = pool_blocks(mask, settings.num_beams, settings.max_new_tokens)
        kv = choose_cache(model, settings, mask).kind
        step = DecoderOnlyStep(model, kv=kv, blocks=blocks, compile=settings.compile or False)
    processors = prompt_processors(settings, prefix, mask)
    runner: Any = step
    if settings.allowed_output is not None:  # the output layer over the ids the dictionary allows some row
        from beamkit.hf.retrieval.allowed import AllowedOutputStep

        fn = settings.prefix_fn
        runner = AllowedOutputStep(step, model, fn.trie, fn.eos, settings.allowed_output)
    state = runner.init_state(input_ids, mask)
    seeds = request_seeds(input_ids, mask) if settings.do_sample else None
    with torch.inference_mode():  # once here, not per step
        hyps, traces = run_search(runner, state, settings, batch, processors, seeds)
    return build_output(settings, prefix, hyps, step.stats, step.forward_seconds, traces)


#: KV bytes per row (every layer's keys and values at the prompt's length plus the new tokens) below which the
#: dense cache is chosen: there the paged cache's host work a step (block tables, the gather index, copy-on-write)
#: costs more than the dense cache's copies save. Measured by bench/kv_choice.py (beam 5, 8 requests, one torch
#: thread): paged/dense 1.17-1.35x at 32 KiB a row, 1.14-1.17x at 48, 0.92-1.03x at 80, 0.97-1.06x at 112,
#: 0.89-0.95x at 144, 0.78-0.88x from 320 KiB (4 x 128 to 6 x 512 models): the crossing lies between 64 and 128.
DENSE_BELOW_BYTES = 96 << 10


@dataclass(frozen=True)
class CacheChoice:
    """The decoder-only key/value cache a call decodes with (``"paged"`` or ``"dense"``) and why."""

    kind: str
    reason: str


def prompt_processors(settings: Settings, prefix: torch.Tensor, mask: torch.Tensor) -> list[Any]:
    """Hugging Face's logits processors for a call whose decoder starts from ``prefix`` (rows, cols).

    The processors see prompt + generated tokens (decoder-only, left padding included) or the decoder tokens from
    the start token on (encoder-decoder); ``mask`` (rows, prompt cols) gives each prompt's first attended column.
    """
    prompts = tuple(tuple(int(t) for t in row) for row in prefix.tolist())
    first = (mask != 0).int().argmax(dim=1).tolist()  # first attended column of each prompt
    if settings.groups > 1:  # diverse beam search decodes each request once per group, as requests of their own
        prompts = tuple(p for p in prompts for _ in range(settings.groups))
        first = [f for f in first for _ in range(settings.groups)]
    return build_processors(settings, prompts, first)


def choose_cache(model: Any, settings: Settings, mask: torch.Tensor) -> CacheChoice:
    """The cache for one call: dense for diverse and constrained beam search (their variants gather rows their
    own way) and where the call named one of Hugging Face's caches; paged where it named ``"paged"``; with no
    cache named, dense for greedy decoding (one row per request: nothing to share) and for rows whose keys and
    values stay below :data:`DENSE_BELOW_BYTES`, paged otherwise."""
    if settings.groups > 1 or settings.force_words:
        return CacheChoice("dense", "diverse or constrained beam search")
    if not settings.kv_chosen:
        return CacheChoice(settings.kv, "cache_implementation names it")
    if settings.num_beams == 1:
        return CacheChoice("dense", "greedy decoding: one row per request, nothing to share")
    per_row = kv_row_bytes(model, int(mask.shape[1]) + settings.max_new_tokens)
    if per_row < DENSE_BELOW_BYTES:
        return CacheChoice("dense", f"{per_row} KV bytes per row, below {DENSE_BELOW_BYTES}")
    return CacheChoice("paged", f"{per_row} KV bytes per row, from {DENSE_BELOW_BYTES} on")


def kv_row_bytes(model: Any, length: int) -> int:
    """Bytes of one row's keys and values over every layer at ``length`` positions, from the model's config
    (``num_hidden_layers``, the key/value heads and head width) and its dtype."""
    cfg = model.config
    layers = int(getattr(cfg, "num_hidden_layers", 0) or 0)
    heads = int(getattr(cfg, "num_attention_heads", 1) or 1)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or int(getattr(cfg, "hidden_size", 0) or 0) // heads)
    width = torch.empty(0, dtype=getattr(model, "dtype", torch.float32)).element_size()
    return 2 * layers * kv_heads * head_dim * width * length


def request_seeds(input_ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    """One noise seed per request for sampling: a draw from torch's global generator (so ``torch.manual_seed``
    makes runs repeat, as with Hugging Face), the request's attended tokens, and how many identical prompts came
    before it in the batch; a request samples the same whatever else is in the batch."""
    base = int(torch.randint(0, 2**62, (1,)).item())
    seen: dict[tuple[int, ...], int] = {}
    out = []
    for ids, keep in zip(input_ids.tolist(), mask.tolist(), strict=True):
        tokens = tuple(t for t, k in zip(ids, keep, strict=True) if k)
        nth = seen.get(tokens, 0)
        seen[tokens] = nth + 1
        out.append([base, nth, len(tokens), *tokens])
    return out


def pool_blocks(mask: torch.Tensor, beams: int, new: int, block_size: int = BLOCK_SIZE) -> int:
    """Blocks a paged cache needs at most for these prompts (``mask`` ``[n, P]``): each request's prompt
    positions once (its beams share them), and per beam the blocks of its own tail: its copy of the prompt's
    partial last block and its new positions; so the pool is made once at its largest size instead of growing
    (each growth copies it)."""
    prompt = (mask != 0).sum(dim=1).tolist()  # attended positions per prompt
    return max(1, sum(-(-int(p) // block_size) + beams * -(-(int(p) % block_size + new) // block_size) for p in prompt))
