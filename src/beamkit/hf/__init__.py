"""Hugging Face bridge: decode any ``transformers`` model with beamkit's engine.

``beamkit.hf.generate(model, input_ids, attention_mask, num_beams=5, max_new_tokens=40)`` is a drop-in for
``model.generate(...)`` beam search: same argument names, defaults taken from ``model.generation_config`` when an
argument is left ``None``, and ``.sequences`` / ``.sequences_scores`` laid out like Hugging Face's. The search runs
on beamkit's engine with the ``"pool"`` policy (Hugging Face 5.x ``_beam_search`` semantics): the prompt is run
once per request, cache rows are gathered only when the parents change, finished requests leave the batch.

Needs ``torch`` and ``transformers`` (imported only when this module is).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from beamkit.engine import BeamSearch, SearchOptions, eos_ids, make_options
from beamkit.hf.output import BeamOutput, build_sequences
from beamkit.hf.processors import ForcedTokens
from beamkit.hf.step import CacheRows, DecoderOnlyStep, EncoderDecoderStep
from beamkit.hypothesis import BatchDecodeError, Hypothesis, SearchStats
from beamkit.processors import BadWords, NoRepeatNGram, RepetitionPenalty, SequenceBias, SuppressTokens
from beamkit.scoring import LengthPenalty
from beamkit.trace import Trace

__all__ = ["BeamOutput", "CacheRows", "DecoderOnlyStep", "EncoderDecoderStep", "ForcedTokens", "generate"]

# generation_config fields that change Hugging Face's beam search but are not mapped here, with their neutral value.
_UNMAPPED = {
    "encoder_repetition_penalty": 1.0,
    "exponential_decay_length_penalty": None,
    "encoder_no_repeat_ngram_size": 0,
    "renormalize_logits": False,
    "do_sample": False,
    "constraints": None,
}


def _eos_list(value: Any) -> list[int] | None:
    """An eos id, list of ids or tensor as a list of distinct ints (order kept), or None (also for none)."""
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    return list(eos_ids(value)) or None


# Hugging Face arguments that change nothing here, with the values that would ask for something beamkit.hf does
# not do: the output is always the dict form with sequences_scores, the key/value cache is always used, and the
# sampling warpers only act with do_sample=True (refused above).
_NO_EFFECT = {
    "return_dict_in_generate": (),
    "use_cache": (False,),
    "temperature": (),
    "top_k": (),
    "top_p": (),
    "typical_p": (),
    "min_p": (),
    "output_scores": (),  # sequences_scores are always there; per-step scores are not (BeamOutput.scores says so)
    "output_logits": (True,),
    "output_attentions": (True,),
    "output_hidden_states": (True,),
}
_OPTION_NAMES = frozenset(f.name for f in dataclasses.fields(SearchOptions)) - {"beam_size", "max_len"}


def _sequence_biases(value: Any) -> tuple[tuple[tuple[int, ...], float], ...]:
    """Hugging Face's ``sequence_bias`` (a dict ``{(ids...): bias}`` or a list ``[[ids], bias]``) as pairs."""
    items = value.items() if isinstance(value, dict) else value
    merged: dict[tuple[int, ...], float] = {}  # as Hugging Face: a sequence listed twice keeps its last bias
    try:
        for ids, bias in items:
            merged[tuple(int(t) for t in ids)] = float(bias)
    except (TypeError, ValueError) as err:
        raise ValueError(f"sequence_bias must map token-id sequences to floats, got {value!r}") from err
    if not merged:
        raise ValueError("sequence_bias is empty")
    return tuple(merged.items())


def _token_ids(value: Any, name: str) -> tuple[int, ...]:
    """An id or a sequence of ids (list, tuple, tensor) as a tuple of ints; TypeError naming ``name`` else."""
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if isinstance(value, int):
        return (value,)
    try:
        return tuple(int(t) for t in value)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name} must be a token id or a list of token ids, got {value!r}") from err


def _pick(value: Any, config: Any, name: str, default: Any) -> Any:
    """The explicit argument, else the generation config's value, else ``default``."""
    if value is not None:
        return value
    got = getattr(config, name, None)
    return default if got is None else got


def generate(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    num_beams: int | None = None,
    max_new_tokens: int | None = None,
    early_stopping: bool | str | None = None,
    length_penalty: float | None = None,
    num_return_sequences: int | None = None,
    min_new_tokens: int | None = None,
    no_repeat_ngram_size: int | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    decoder_start_token_id: int | None = None,
    **beamkit_options: Any,
) -> BeamOutput:
    """Beam search on a Hugging Face model with beamkit's engine, returning what ``model.generate`` returns.

    Arguments follow ``transformers``' ``generate``: ``None`` means "take it from ``model.generation_config``"
    (``num_beams`` 1, ``early_stopping`` False, ``length_penalty`` 1.0 when unset there). ``input_ids``
    ``[batch, P]`` are left-padded prompts (decoder-only) or encoder inputs (encoder-decoder); ``attention_mask``
    is inferred from ``pad_token_id`` like Hugging Face does when omitted. ``num_beams=1`` is greedy decoding.
    ``repetition_penalty`` and ``bad_words_ids`` (keywords, or the generation config's, such as Marian's ban on
    its pad token) become beamkit's :class:`~beamkit.RepetitionPenalty` and :class:`~beamkit.BadWords` with
    Hugging Face's conventions (the prompt counts, its left padding not for the penalty; eos is never banned);
    ``suppress_tokens``, ``begin_suppress_tokens`` and ``sequence_bias`` become :class:`~beamkit.SuppressTokens`
    and :class:`~beamkit.SequenceBias`, in Hugging Face's order.
    Other ``**beamkit_options`` go to :class:`beamkit.SearchOptions` (``patience``, ``exact_exit``, extra
    ``processors`` applied after the mapped ones, ``selector``, ``final_scorer``, ...). Two Hugging Face
    features that 5.x no longer ships run on beamkit's variants: ``num_beam_groups`` + ``diversity_penalty``
    (diverse beam search, :func:`beamkit.variants.diverse_beam_search`) and ``force_words_ids`` (lexically
    constrained beam search, :func:`beamkit.variants.constrained_beam_search`; only hypotheses containing every
    forced word are returned).

    Returns a :class:`BeamOutput` with ``sequences``, ``sequences_scores`` and beamkit's ``hypotheses``.
    ``eos_token_id`` may be a list (any of them finishes a hypothesis, as in Hugging Face). Raises ValueError for
    inputs or generation settings the bridge cannot reproduce exactly (sampling, unmapped logit processors).
    """
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise TypeError("input_ids must be a 2-D torch tensor [batch, sequence]")
    if input_ids.dtype not in (torch.long, torch.int32, torch.int64):
        raise TypeError(f"input_ids must hold integer token ids, got {input_ids.dtype}")
    if input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must have at least one row and one column, got shape {tuple(input_ids.shape)}")
    gc = beamkit_options.pop("generation_config", None) or getattr(model, "generation_config", None)
    cfg = model.config
    is_enc_dec = bool(getattr(cfg, "is_encoder_decoder", False))
    repetition = float(_pick(beamkit_options.pop("repetition_penalty", None), gc, "repetition_penalty", 1.0))
    bad_words = _pick(beamkit_options.pop("bad_words_ids", None), gc, "bad_words_ids", None)
    suppress = _pick(beamkit_options.pop("suppress_tokens", None), gc, "suppress_tokens", None)
    begin_suppress = _pick(beamkit_options.pop("begin_suppress_tokens", None), gc, "begin_suppress_tokens", None)
    sequence_bias = _pick(beamkit_options.pop("sequence_bias", None), gc, "sequence_bias", None)
    for name, neutral in _UNMAPPED.items():
        if name in beamkit_options:  # an explicit Hugging Face-style override, e.g. do_sample=False
            value = beamkit_options.pop(name)
            if value not in (neutral, None):
                raise ValueError(f"{name}={value!r} is not supported by beamkit.hf (only {neutral!r})")
            continue
        if gc is not None and getattr(gc, name, neutral) not in (neutral, None):
            raise ValueError(
                f"generation_config.{name}={getattr(gc, name)!r} is not mapped by beamkit.hf; set it to "
                f"{neutral!r} or pass an equivalent beamkit processor"
            )

    for name, refused in _NO_EFFECT.items():
        value = beamkit_options.pop(name, None)
        if value is not None and value in refused:
            why = (
                "the key/value cache is always used"
                if name == "use_cache"
                else "the output carries sequences, sequences_scores and hypotheses with token log-probs"
            )
            raise ValueError(f"{name}={value!r} is not supported by beamkit.hf ({why})")
    max_length = beamkit_options.pop("max_length", None)
    min_length = _pick(beamkit_options.pop("min_length", None), gc, "min_length", None)
    forced_bos = _pick(beamkit_options.pop("forced_bos_token_id", None), gc, "forced_bos_token_id", None)
    forced_eos = _eos_list(_pick(beamkit_options.pop("forced_eos_token_id", None), gc, "forced_eos_token_id", None))
    for name, instead in (("num_return", "num_return_sequences"), ("min_len", "min_new_tokens")):
        if name in beamkit_options:
            raise TypeError(f"generate() takes {instead}=, not the SearchOptions field {name}=")
    unknown = sorted(set(beamkit_options) - _OPTION_NAMES - {"num_beam_groups", "diversity_penalty", "force_words_ids"})
    if unknown:
        raise TypeError(
            f"generate() got unexpected keyword arguments {unknown}: neither Hugging Face settings beamkit.hf "
            "maps nor beamkit.SearchOptions fields"
        )

    num_beams = int(_pick(num_beams, gc, "num_beams", 1))
    early_stopping = _pick(early_stopping, gc, "early_stopping", False)
    alpha = float(_pick(length_penalty, gc, "length_penalty", 1.0))
    num_return = int(_pick(num_return_sequences, gc, "num_return_sequences", 1))
    min_new = _pick(min_new_tokens, gc, "min_new_tokens", None)
    ngram = int(_pick(no_repeat_ngram_size, gc, "no_repeat_ngram_size", 0))
    eos = _eos_list(_pick(eos_token_id, gc, "eos_token_id", None))
    pad = _pick(pad_token_id, gc, "pad_token_id", None)
    if pad is None and eos is not None:
        pad = eos[0]  # what Hugging Face does (with a warning)
    if num_beams < 1:
        raise ValueError(f"num_beams must be >= 1, got {num_beams}")
    if not 1 <= num_return <= num_beams:
        raise ValueError(f"num_return_sequences must be between 1 and num_beams={num_beams}, got {num_return}")
    if early_stopping not in (True, False, "never"):
        raise ValueError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")

    batch, width = input_ids.shape
    if attention_mask is None:
        if pad is not None and bool((input_ids == pad).any()) and (eos is None or pad not in eos):
            attention_mask = (input_ids != pad).long()
        else:
            attention_mask = torch.ones_like(input_ids, dtype=torch.long)
    if tuple(attention_mask.shape) != (batch, width):
        raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape {(batch, width)}")

    if is_enc_dec:
        start = _pick(decoder_start_token_id, gc, "decoder_start_token_id", None)
        if start is None:
            start = getattr(cfg, "decoder_start_token_id", None)
        if start is None:
            raise ValueError("encoder-decoder model without decoder_start_token_id; pass decoder_start_token_id=")
        prefix = torch.full((batch, 1), int(start), dtype=torch.long, device=input_ids.device)
        step: DecoderOnlyStep | EncoderDecoderStep = EncoderDecoderStep(model)
    else:
        start = 0  # ignored: the first call runs the prompt
        prefix = input_ids
        step = DecoderOnlyStep(model)
    prompt_len = prefix.shape[1]
    # Hugging Face 5.x: max_new_tokens (argument, else config) wins; else max_length, which counts the prompt
    # (decoder-only) or the start token; with neither, 20 new tokens within max_position_embeddings
    max_new_tokens = _pick(max_new_tokens, gc, "max_new_tokens", None)
    if max_new_tokens is None:
        total = _pick(max_length, gc, "max_length", None)
        if total is None:
            total = 20 + prompt_len
            positions = getattr(cfg, "max_position_embeddings", None)
            if positions is not None:
                total = min(total, int(positions))
        max_new_tokens = int(total) - prompt_len
    max_new_tokens = int(max_new_tokens)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")

    # Hugging Face's processors see prompt + generated tokens (decoder-only; left padding included) or the decoder
    # tokens from the start token on (encoder-decoder): the same prompts here.
    prompts = tuple(tuple(int(t) for t in row) for row in prefix.tolist())
    procs: list[Any] = []
    if sequence_bias is not None:  # first, as in Hugging Face (the repetition penalty then scales biased scores)
        procs.append(SequenceBias(_sequence_biases(sequence_bias), prompts))
    if repetition != 1.0:
        if is_enc_dec:
            seen = prompts
        else:  # Hugging Face skips the left padding (everything before the first attended position)
            first = (attention_mask != 0).int().argmax(dim=1).tolist()
            seen = tuple(p[f:] for p, f in zip(prompts, first, strict=True))
        procs.append(RepetitionPenalty(repetition, seen))
    if ngram > 0:
        procs.append(NoRepeatNGram(ngram, prompts))
    if bad_words is not None:
        banned = tuple(tuple(int(t) for t in word) for word in bad_words)
        if eos is not None:  # Hugging Face never bans eos itself
            banned = tuple(w for w in banned if not (len(w) == 1 and w[0] in eos))
        if banned:
            procs.append(BadWords(banned, prompts))
    # Hugging Face 5.x: min_new_tokens (argument, else config) replaces min_length, which counts the prompt
    wanted = int(min_new) if min_new is not None else int(min_length or 0) - prompt_len
    min_len = max(0, wanted) if eos is not None else 0
    if forced_bos is not None and prompt_len == 1:
        procs.append(ForcedTokens(0, (int(forced_bos),)))
    if forced_eos is not None:
        procs.append(ForcedTokens(max_new_tokens - 1, tuple(forced_eos)))
    if suppress is not None:
        suppressed = _token_ids(suppress, "suppress_tokens")
        forced = {int(forced_bos)} if forced_bos is not None else set()
        clash = sorted((forced | set(forced_eos or ())) & set(suppressed))
        if clash:
            raise ValueError(f"suppress_tokens {clash} are also forced (forced_bos_token_id / forced_eos_token_id)")
        procs.append(SuppressTokens(suppressed))
    if begin_suppress is not None:  # Hugging Face's begin index: one step later after a forced first token
        later = prompt_len == 1 and forced_bos is not None
        procs.append(SuppressTokens(_token_ids(begin_suppress, "begin_suppress_tokens"), at_step=1 if later else 0))
    procs.extend(beamkit_options.pop("processors", ()))

    groups = int(beamkit_options.pop("num_beam_groups", 1) or 1)
    diversity = float(beamkit_options.pop("diversity_penalty", 0.0) or 0.0)
    force_words = beamkit_options.pop("force_words_ids", None)
    common: dict[str, Any] = {
        "length_penalty": LengthPenalty.power(alpha),
        "policy": beamkit_options.pop("policy", "pool"),
        "early_stopping": True if num_beams == 1 else early_stopping,
        "min_len": min_len,
        "processors": procs,
        # Hugging Face's greedy search processes raw logits, its beam search log-probabilities
        "process_logits": num_beams == 1,
        **beamkit_options,
    }
    if groups > 1 and force_words:
        raise ValueError("num_beam_groups and force_words_ids cannot be combined")
    if groups > 1 and num_beams % groups:
        raise ValueError(f"num_beams ({num_beams}) must be a multiple of num_beam_groups ({groups})")
    state = step.init_state(input_ids, attention_mask.to(input_ids.device))
    stop = tuple(eos or ())
    with torch.inference_mode():  # once here, not per step
        hyps, stats, traces = _search(
            step,
            state,
            int(start),
            stop,
            batch,
            num_beams,
            max_new_tokens,
            num_return,
            groups,
            diversity,
            force_words,
            common,
        )
    if num_beams == 1:
        fill = int(pad) if pad is not None else -1
    else:  # Hugging Face's beam search fills with `pad or eos[0]` (a pad id of 0 counts as unset there)
        fill = int(pad) if pad else (eos[0] if eos is not None else -1)
    sequences, scores = build_sequences(prefix, hyps, num_return, fill)
    return BeamOutput(sequences, scores, hyps, stats, step.forward_seconds, traces)


def _search(
    step: Any,
    state: Any,
    start: int,
    stop: tuple[int, ...],
    batch: int,
    num_beams: int,
    max_new_tokens: int,
    num_return: int,
    groups: int,
    diversity: float,
    force_words: Any,
    common: dict[str, Any],
) -> tuple[list[list[Hypothesis]], SearchStats, list[Trace | None] | None]:
    """Run the search ``generate`` configured: diverse, constrained or plain beam search (the last alone keeps
    traces with ``record_trace=True``)."""
    if groups > 1:
        from beamkit.variants import diverse_beam_search

        hyps = diverse_beam_search(
            step, state, start, stop, num_beams, max_new_tokens, groups, diversity, num_return=num_return, **common
        )
        return hyps, SearchStats(), None
    if force_words:
        from beamkit.variants import constrained_beam_search

        found = constrained_beam_search(
            step, state, start, stop, num_beams, max_new_tokens, constraints=force_words, **common
        )
        return [h[:num_return] for h in found], SearchStats(), None
    options = make_options(num_beams, max_new_tokens, num_return=num_return, **common)
    result = BeamSearch(options).search(step, state, start, stop, batch)
    if result.errors:
        raise BatchDecodeError(result.errors, result.hypotheses)
    return result.hypotheses, result.stats, result.trace
