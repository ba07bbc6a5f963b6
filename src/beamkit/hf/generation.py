"""``beamkit.hf.generate``: Hugging Face's ``model.generate`` (beam search and greedy) on beamkit's engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from beamkit.constraints import check_vocab
from beamkit.hf.inputs import attention_mask_for, check_input_ids, check_model, output_size
from beamkit.hf.output import build_output
from beamkit.hf.paged import BLOCK_SIZE
from beamkit.hf.processors import build_processors
from beamkit.hf.search import run_search
from beamkit.hf.settings import Settings, Unsupported, is_generation_config, merge_config, resolve
from beamkit.hf.step import DecoderOnlyStep, EncoderDecoderStep


def generate(model: Any, inputs: torch.Tensor | None = None, second: Any = None, /, **kwargs: Any) -> Any:
    """Decode with beamkit and return exactly what ``model.generate(inputs, ..., **kwargs)`` returns.

    A call site switches by writing ``beamkit.hf.generate(model, `` for ``model.generate(``: ``inputs`` (or
    ``input_ids=``) are left-padded prompts (decoder-only) or encoder inputs (encoder-decoder);
    the second positional argument is the ``attention_mask``, or a ``GenerationConfig`` (Hugging Face's second
    positional argument); ``attention_mask=`` as a keyword works too, and it is inferred from ``pad_token_id`` when
    omitted. Generation settings are keyword arguments over ``generation_config`` (default: the model's), read
    with Hugging Face 5.x's defaults: ``num_beams`` (1 is greedy decoding), ``max_new_tokens`` / ``max_length``,
    ``min_new_tokens`` / ``min_length``, ``early_stopping``, ``length_penalty``, ``num_return_sequences``,
    ``eos_token_id`` (one id or a list), ``pad_token_id``, ``decoder_start_token_id``, ``no_repeat_ngram_size``,
    ``repetition_penalty``, ``bad_words_ids``, ``suppress_tokens``, ``begin_suppress_tokens``,
    ``sequence_bias``, ``forced_bos_token_id``, ``forced_eos_token_id``, plus ``num_beam_groups`` +
    ``diversity_penalty`` (diverse beam search) and ``force_words_ids`` (constrained beam search), which
    Hugging Face 5.x no longer ships. Other keywords are :class:`beamkit.SearchOptions` fields (``patience``,
    ``exact_exit``, extra ``processors`` applied after the mapped ones, ...).

    Returns the ``sequences`` tensor, or with ``return_dict_in_generate`` Hugging Face's output object with
    beamkit's ``hypotheses`` and ``stats`` added (see :mod:`beamkit.hf.output`). Raises
    :class:`beamkit.hf.Unsupported` (a ValueError) for settings beamkit.hf does not reproduce exactly, naming
    them; ValueError / TypeError for bad input; :class:`beamkit.BatchDecodeError` when a request fails.
    """
    return run_generate(model, inputs, second, kwargs, exact_only=False)


def run_generate(model: Any, inputs: Any, attention_mask: Any, kwargs: dict[str, Any], exact_only: bool) -> Any:
    """:func:`generate` with its keywords as a dict: the engine bridge where it takes the call, else beamkit's
    decoding loop inside Hugging Face's own ``generate`` (:mod:`beamkit.hf.loop`: Whisper and other models with
    their own ``generate``, inputs other than token ids, model inputs the bridge does not pass on, and per-step
    ``scores``, which only the loop keeps in Hugging Face's layout). ``exact_only`` is :func:`prepare`'s."""
    try:
        job = prepare(model, inputs, attention_mask, kwargs, exact_only)
        if wants_tables(job.settings) and loop_decodes(job.settings):
            raise Unsupported("per-step scores: the loop keeps Hugging Face's tables")
    except Unsupported:
        kwargs = dict(kwargs)
        if attention_mask is not None:  # beamkit's second positional: a GenerationConfig or the attention mask
            key = "generation_config" if is_generation_config(attention_mask) else "attention_mask"
            if key in kwargs:
                raise TypeError(f"generate() got {key} twice") from None
            kwargs[key] = attention_mask
        return generate_in_loop(model, () if inputs is None else (inputs,), kwargs)
    return job()


def generate_in_loop(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], original: Any = None) -> Any:
    """``model.generate(*args, **kwargs)`` (``original``: the unpatched ``generate``) with beamkit's loop as its
    decoding method; :class:`Unsupported` for arguments the loop is not handed (an assistant model, a streamer,
    a tokenizer, a decoding method of the caller's own, ``synced_gpus=True``) and, from the loop, for generation
    modes it does not decode."""
    from beamkit.hf.loop import decode

    taken = sorted(n for n in HOST_ONLY if kwargs.get(n) not in (None, False))
    if taken or len(args) > 2:
        names = ", ".join(f"{n}=" for n in taken) or "positional arguments after generation_config"
        raise Unsupported(f"{names}: Hugging Face's generate does not hand it to a custom decoding method")
    check_mode(model, args, kwargs)
    call = original if original is not None else unpatched(model)
    return call(*args, custom_generate=decode, **kwargs)


def check_mode(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """:class:`Unsupported` when the call's generation mode (from its settings merged over the model's
    generation config) is one beamkit's loop does not decode: refused before Hugging Face's ``generate`` runs,
    since it expands some inputs in place (a given ``encoder_outputs``) and a rerun would see them expanded."""
    from beamkit.hf.loop import loop_for

    passed = args[1] if len(args) > 1 else kwargs.get("generation_config")
    if not is_generation_config(passed):
        passed = None
    settings = {k: v for k, v in kwargs.items() if k != "generation_config"}
    gc, _, _ = merge_config(passed, getattr(model, "generation_config", None), settings)
    try:
        loop_for(gc)
    except Unsupported:
        raise
    except (ValueError, TypeError):  # settings Hugging Face rejects: its own generate says so
        return


# generate()'s arguments that reach only Hugging Face's own decoding methods, never a custom one
HOST_ONLY = ("assistant_model", "streamer", "tokenizer", "assistant_tokenizer", "custom_generate", "synced_gpus")


def unpatched(model: Any) -> Any:
    """The model's ``generate`` without a :func:`beamkit.hf.patch` around it."""
    handle = getattr(getattr(model, "generate", None), "beamkit_patch", None)
    return handle.original if handle is not None else model.generate


def prepare(model: Any, inputs: Any, attention_mask: Any, kwargs: dict[str, Any], exact_only: bool) -> Any:
    """The engine bridge's decoding of one call, checked and ready to run (a callable). Raises
    :class:`Unsupported` for calls the bridge does not take: a model with its own ``generate`` (Whisper), no
    ``input_ids`` (``inputs_embeds``, or nothing), models whose inputs are not token ids, and settings it does
    not reproduce; with ``exact_only``
    also per-step score tables (``output_scores`` with ``return_dict_in_generate``) and sampling (beamkit's
    bridge draws from its own noise, not from Hugging Face's RNG stream). ValueError / TypeError for bad input.
    The bridge itself returns no per-step tables (``scores`` is None)."""
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
    gc, rest, given = merge_config(passed, getattr(model, "generation_config", None), kwargs)
    input_ids = check_input_ids(inputs, model)
    settings = resolve(model, gc, rest, given, input_ids.shape[1])
    width = output_size(model)
    if settings.prefix_fn is not None and width is not None:
        check_vocab(settings.prefix_fn.trie, width, "the prefix_allowed_tokens_fn's dictionary")
    outside = [e for e in settings.eos if e < 0 or width is not None and e >= width]
    if outside:  # Hugging Face warns and never stops on them
        raise Unsupported(f"eos ids {outside} outside the model's output")
    if exact_only and wants_tables(settings):
        raise Unsupported("output_scores=True with return_dict_in_generate: per-step scores come from the loop")
    if exact_only and settings.do_sample:
        raise Unsupported("do_sample=True: beamkit samples from its own noise, not Hugging Face's RNG stream")
    mask = attention_mask_for(input_ids, attention_mask, settings.pad, settings.eos)
    return Prepared(model, input_ids, mask, settings)


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
        step = EncoderDecoderStep(model)
    else:
        prefix = input_ids
        variant = settings.groups > 1 or bool(settings.force_words)  # diverse / constrained search: dense cache
        blocks = pool_blocks(mask, settings.num_beams, settings.max_new_tokens)
        step = DecoderOnlyStep(model, kv="dense" if variant else settings.kv, blocks=blocks)
    # Hugging Face's processors see prompt + generated tokens (decoder-only, left padding included) or the
    # decoder tokens from the start token on (encoder-decoder)
    prompts = tuple(tuple(int(t) for t in row) for row in prefix.tolist())
    first = (mask != 0).int().argmax(dim=1).tolist()  # first attended column of each prompt
    if settings.groups > 1:  # diverse beam search decodes each request once per group, as requests of their own
        prompts = tuple(p for p in prompts for _ in range(settings.groups))
        first = [f for f in first for _ in range(settings.groups)]
    processors = build_processors(settings, prompts, first)
    state = step.init_state(input_ids, mask)
    seeds = request_seeds(input_ids, mask) if settings.do_sample else None
    with torch.inference_mode():  # once here, not per step
        hyps, traces = run_search(step, state, settings, batch, processors, seeds)
    return build_output(settings, prefix, hyps, step.stats, step.forward_seconds, traces)


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
