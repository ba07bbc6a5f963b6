"""Hugging Face generation settings -> one frozen :class:`Settings` for :func:`beamkit.hf.generate`.

Arguments are merged over the generation config as ``model.generate`` does (an argument that is ``None`` leaves
the config's value), then read with Hugging Face 5.x's defaults. What beamkit.hf does not reproduce exactly is
refused with :class:`Unsupported`, naming the setting (``beamkit.hf.patch`` falls back to Hugging Face on it);
arguments that are neither generation settings nor :class:`beamkit.SearchOptions` fields are a TypeError.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from beamkit._checks import check_choice, check_float, check_int
from beamkit.hf.errors import Unsupported
from beamkit.models.compiled import compile_setting
from beamkit.search import SearchOptions, eos_ids

# Generation-config fields that change Hugging Face's output but are not mapped, with their neutral values.
UNMAPPED: dict[str, tuple[Any, ...]] = {
    "encoder_repetition_penalty": (1.0,),
    "exponential_decay_length_penalty": (),
    "encoder_no_repeat_ngram_size": (0,),
    "renormalize_logits": (False,),
    "constraints": (),
    "max_time": (),
    "stop_strings": (),
    "guidance_scale": (1.0,),
    "watermarking_config": (),
    "token_healing": (False,),
    "penalty_alpha": (0.0,),
    "dola_layers": (),
    "prompt_lookup_num_tokens": (),
    "low_memory": (False,),
    "use_mtp": (False,),
    "use_cache": (True,),  # False: beamkit.hf always uses the key/value cache
    "output_logits": (False,),  # True: per-step [rows, V] tables are not kept
    "output_attentions": (False,),
    "output_hidden_states": (False,),
}

# Fields read below, and fields that cannot change the output (assistant settings act only with an assistant
# model, cache and compile settings only change speed).
MAPPED = frozenset(
    {
        "max_length",
        "max_new_tokens",
        "min_length",
        "min_new_tokens",
        "early_stopping",
        "num_beams",
        "length_penalty",
        "no_repeat_ngram_size",
        "bad_words_ids",
        "repetition_penalty",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "suppress_tokens",
        "begin_suppress_tokens",
        "sequence_bias",
        "num_return_sequences",
        "pad_token_id",
        "bos_token_id",
        "eos_token_id",
        "decoder_start_token_id",
        "num_beam_groups",
        "diversity_penalty",
        "force_words_ids",
        "return_dict_in_generate",
        "output_scores",
        "do_sample",
        "temperature",
        "top_k",
        "top_p",
        "cache_implementation",
    }
)
NO_EFFECT = frozenset(
    {
        "remove_invalid_values",
        "cache_config",
        "max_cache_len",
        "compile_config",
        "disable_compile",
        "prefill_chunk_size",
        "continuous_batching_config",
        "is_assistant",
        "num_assistant_tokens",
        "num_assistant_tokens_schedule",
        "assistant_confidence_threshold",
        "max_matching_ngram_size",
        "assistant_early_exit",
        "assistant_lookbehind",
        "target_lookbehind",
        "assistant_ensemble_weight",
        "speculation_type",
        "transformers_version",
    }
)
# Sampling warpers beamkit.hf does not map (they act only with do_sample=True), with their neutral values.
SAMPLING_UNMAPPED: dict[str, tuple[Any, ...]] = {
    "min_p": (),
    "top_h": (),
    "typical_p": (1.0,),
    "epsilon_cutoff": (0.0,),
    "eta_cutoff": (0.0,),
}
# model.generate's own arguments (not generation-config fields): only their "unused" value is reproduced.
CALL_ARGUMENTS = (
    "logits_processor",
    "stopping_criteria",
    "prefix_allowed_tokens_fn",
    "synced_gpus",
    "assistant_model",
    "streamer",
    "negative_prompt_ids",
    "negative_prompt_attention_mask",
    "custom_generate",
    "assistant_tokenizer",
    "tokenizer",
)
SEARCH_OPTION_NAMES = frozenset(f.name for f in dataclasses.fields(SearchOptions)) - {"beam_size", "max_len"}


@dataclass(frozen=True)
class Settings:
    """Everything one ``generate`` call decodes with, resolved (Hugging Face defaults applied).

    Token ids are ints; ``eos`` is empty when there is none. ``prompt_len`` is the decoder prefix the settings
    count lengths from (the prompt for decoder-only models, the start token for encoder-decoder models).
    ``search_options`` are the remaining :class:`beamkit.SearchOptions` keywords, as (name, value) pairs.
    ``prefix_fn`` is a ``prefix_allowed_tokens_fn`` made by :meth:`beamkit.Trie.prefix_allowed_tokens_fn`
    (the only kind the bridge takes: it applies the trie vectorised). ``kv`` is the decoder-only key/value cache
    (:class:`beamkit.hf.DecoderOnlyStep`'s ``kv``): ``"paged"``
    unless ``cache_implementation`` names one of Hugging Face's caches (``"dynamic"``, ``"static"``, ...), which
    selects the dense ``DynamicCache`` bridge (the same output either way). ``kv_chosen``: the call named no
    cache, so :func:`beamkit.hf.bridge.generation.choose_cache` may keep it dense where paging does not pay.
    """

    encoder_decoder: bool
    prompt_len: int
    start: int
    num_beams: int
    max_new_tokens: int
    min_new_tokens: int
    early_stopping: bool | str
    length_penalty: float
    num_return: int
    eos: tuple[int, ...]
    pad: int | None
    no_repeat_ngram: int = 0
    repetition_penalty: float = 1.0
    bad_words: tuple[tuple[int, ...], ...] = ()
    suppress: tuple[int, ...] | None = None
    begin_suppress: tuple[int, ...] | None = None
    sequence_bias: tuple[tuple[tuple[int, ...], float], ...] | None = None
    forced_bos: int | None = None
    forced_eos: tuple[int, ...] | None = None
    groups: int = 1
    diversity: float = 0.0
    force_words: tuple[Any, ...] | None = None
    return_dict: bool = False
    output_scores: bool = False
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    search_options: tuple[tuple[str, Any], ...] = ()
    kv: str = "paged"
    kv_chosen: bool = False  # True: the call named no cache (cache_implementation=None), beamkit picks by size
    prefix_fn: Any = None  # a beamkit.Trie's prefix_allowed_tokens_fn (applied vectorised), or None
    allowed_output: str | None = None  # the output layer over the allowed ids: "vocab", "allowed" or None (all)
    compile: str | None = None  # the torch.compile backend of the decoding step (None: eager)

    @property
    def fill(self) -> int:
        """The id that pads ``sequences``: greedy uses ``pad``; beam search ``pad or eos[0]`` (a pad id of 0
        counts as unset there, as in Hugging Face), -1 with neither."""
        if self.num_beams == 1:
            return self.pad if self.pad is not None else -1
        if self.pad:
            return self.pad
        return self.eos[0] if self.eos else -1


def _eos_list(value: Any) -> tuple[int, ...]:
    """An eos id, list of ids or tensor as a tuple of distinct ints (order kept), empty for none."""
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    return eos_ids(value)


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


def _bad_words(value: Any) -> tuple[tuple[int, ...], ...]:
    """``bad_words_ids`` (None or a non-empty list of token-id lists, as Hugging Face requires) as tuples."""
    if value is None:
        return ()
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if (
        not isinstance(value, (list, tuple))
        or not value
        or not all(isinstance(w, (list, tuple, torch.Tensor)) for w in value)
    ):
        raise ValueError(
            f"bad_words_ids must be a non-empty list of token-id lists (a list of lists, such as [[5], [7, 8]]), "
            f"got {value!r}"
        )
    return tuple(_token_ids(w, "bad_words_ids") for w in value)


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


def is_generation_config(value: Any) -> bool:
    """Whether ``value`` is a ``transformers.GenerationConfig`` (by name: telling it apart needs no import)."""
    return type(value).__name__ == "GenerationConfig"


def merge_config(passed: Any, own: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any], set[str]]:
    """The generation config of one call, as ``model.generate`` builds it: ``passed`` (a ``GenerationConfig`` or
    None) copied, its unset (None) fields filled from the model's ``own``, then updated with the keyword
    arguments that are generation-config fields and not None. Returns (config, the other keywords, the names
    given as arguments)."""
    source = passed if passed is not None else own
    gc = copy.copy(source) if source is not None else _blank_config()
    if passed is not None and own is not None and own is not passed:
        for name, value in vars(own).items():
            if not name.startswith("_") and getattr(gc, name, None) is None:
                setattr(gc, name, value)
    given = set()
    rest = {}
    for name, value in kwargs.items():
        if name in MAPPED or name in NO_EFFECT or name in UNMAPPED or name in vars(gc) and not name.startswith("_"):
            if value is not None:
                setattr(gc, name, value)
                given.add(name)
        else:
            rest[name] = value
    return gc, rest, given


def _blank_config() -> Any:
    from transformers import GenerationConfig

    return GenerationConfig()


def _refuse_unmapped(gc: Any, given: set[str]) -> None:
    """Raise :class:`Unsupported` for a setting beamkit.hf would have to ignore."""
    sampling = bool(gc.do_sample)
    for name, value in vars(gc).items():
        if name.startswith("_") or value is None or name in MAPPED or name in NO_EFFECT:
            continue
        if name in SAMPLING_UNMAPPED and not sampling:
            continue
        neutral = UNMAPPED.get(name, SAMPLING_UNMAPPED.get(name, ()))
        if value in neutral:
            continue
        where = f"{name}={value!r}" if name in given else f"generation_config.{name}={value!r}"
        allowed = f"(only {neutral[0]!r})" if neutral else "(only None)"
        raise Unsupported(f"{where} is not reproduced by beamkit.hf {allowed}")


def _refuse_call_arguments(rest: dict[str, Any]) -> None:
    """``model.generate``'s own arguments: only their unused value (None, an empty list, False) is accepted."""
    for name in CALL_ARGUMENTS:
        value = rest.pop(name, None)
        if value is None or value is False or (isinstance(value, (list, tuple)) and not value):
            continue
        raise Unsupported(f"{name}= is not reproduced by beamkit.hf (pass beamkit processors= instead)")


def _prefix_fn(fn: Any) -> Any:
    """A ``prefix_allowed_tokens_fn`` the bridge applies itself: one made by
    :meth:`beamkit.Trie.prefix_allowed_tokens_fn` (None stays None); :class:`Unsupported` for any other."""
    from beamkit.constraints import PrefixFn

    if fn is None or isinstance(fn, PrefixFn):
        return fn
    raise Unsupported(
        "prefix_allowed_tokens_fn= is not reproduced by beamkit.hf unless it comes from beamkit.Trie."
        "prefix_allowed_tokens_fn (pass beamkit processors= instead)"
    )


def _length_setting(gc: Any, given: set[str], name: str) -> str:
    """How the user set ``name``: as an argument or through the generation config."""
    return name if name in given else f"generation_config.{name}"


def resolve(model: Any, gc: Any, rest: dict[str, Any], given: set[str], width: int) -> Settings:
    """The :class:`Settings` of one call: ``gc`` is the merged generation config, ``rest`` the other keywords
    (SearchOptions fields; consumed), ``width`` the columns of ``input_ids``. Each concern is resolved by its own
    function, in this order: the call's arguments, the beams, the tokens the search starts and stops with, the
    lengths, the logits processors' settings, sampling."""
    _refuse_unmapped(gc, given)
    allowed_output = rest.pop("allowed_output", None)
    compile_backend = compile_setting(rest.pop("compile", False))
    prefix_fn = _call_arguments(model, rest)
    cfg = model.config
    encoder_decoder = bool(getattr(cfg, "is_encoder_decoder", False))
    _check_compile(compile_backend, allowed_output, gc)
    num_beams = _int(gc.num_beams, "num_beams", 1)
    num_return = _int(gc.num_return_sequences, "num_return_sequences", 1)
    early_stopping = False if gc.early_stopping is None else gc.early_stopping
    check_int("num_beams", num_beams, 1)
    # sampling without beams draws num_return_sequences rows per prompt, as Hugging Face does (see prepare)
    check_int("num_return_sequences", num_return, 1, None if gc.do_sample and num_beams == 1 else num_beams)
    check_choice("early_stopping", early_stopping, (True, False, "never"))
    tokens = _tokens(gc, cfg, encoder_decoder, width)
    prompt_len, eos = tokens["prompt_len"], tokens["eos"]
    if prefix_fn is not None and prefix_fn.prompt_len != prompt_len:  # the loop runs it as Hugging Face would
        raise Unsupported(
            f"prefix_allowed_tokens_fn was made with prompt_len={prefix_fn.prompt_len} but the decoder's prefix is "
            f"{prompt_len} tokens long (the padded prompt, or the start token of an encoder-decoder model): make "
            f"it with trie.prefix_allowed_tokens_fn(prompt_len={prompt_len})"
        )
    lengths = _lengths(cfg, gc, given, prompt_len, encoder_decoder, eos)
    _check_allowed_output(allowed_output, prefix_fn, encoder_decoder, gc)
    return Settings(
        encoder_decoder=encoder_decoder,
        num_beams=num_beams,
        early_stopping=early_stopping,
        length_penalty=float(1.0 if gc.length_penalty is None else gc.length_penalty),
        num_return=num_return,
        **tokens,
        **lengths,
        **_variants(gc, num_beams),
        **_processor_settings(gc),
        return_dict=bool(gc.return_dict_in_generate),
        output_scores=bool(gc.output_scores),
        search_options=tuple(rest.items()),
        kv="paged" if gc.cache_implementation in (None, "paged") else "dense",
        kv_chosen=gc.cache_implementation is None,
        prefix_fn=prefix_fn,
        allowed_output=allowed_output,
        compile=compile_backend,
        **_sampling(gc, num_beams, eos),
    )


def _check_allowed_output(value: Any, prefix_fn: Any, encoder_decoder: bool, gc: Any) -> None:
    """``allowed_output=`` (the output layer over a dictionary's allowed ids): None, ``"vocab"`` or
    ``"allowed"``; it needs a :class:`beamkit.Trie`'s ``prefix_allowed_tokens_fn`` and plain beam search or
    greedy decoding of a decoder-only model (:class:`Unsupported` otherwise)."""
    if value is None:
        return
    check_choice("allowed_output", value, ("vocab", "allowed"))
    if prefix_fn is None:
        raise ValueError("allowed_output= needs prefix_allowed_tokens_fn= from a beamkit.Trie (the allowed ids)")
    if encoder_decoder:
        raise Unsupported("allowed_output= with an encoder-decoder model (decoder-only models only)")
    if (getattr(gc, "num_beam_groups", None) or 1) > 1 or getattr(gc, "force_words_ids", None) or gc.do_sample:
        raise Unsupported(
            "allowed_output= with diverse or constrained beam search or sampling (beam search and greedy only)"
        )


def _check_compile(backend: str | None, allowed_output: Any, gc: Any) -> None:
    """``compile=`` (a compiled decoding step): beam search, greedy decoding or sampling, without
    ``allowed_output`` (:class:`Unsupported` otherwise)."""
    if backend is None:
        return
    if allowed_output is not None:
        raise Unsupported("compile= with allowed_output= (its output layer changes every step)")
    if (getattr(gc, "num_beam_groups", None) or 1) > 1 or getattr(gc, "force_words_ids", None):
        raise Unsupported("compile= with diverse or constrained beam search (beam search, greedy, sampling only)")


def _call_arguments(model: Any, rest: dict[str, Any]) -> Any:
    """Check the call's keywords beyond the generation config (``rest``: :class:`beamkit.SearchOptions` fields,
    its ``prefix_allowed_tokens_fn`` taken out); returns that function's trie form, or None."""
    prefix_fn = _prefix_fn(rest.pop("prefix_allowed_tokens_fn", None))
    _refuse_call_arguments(rest)
    for name, instead in (("num_return", "num_return_sequences"), ("min_len", "min_new_tokens")):
        if name in rest:
            raise TypeError(f"generate() takes {instead}=, not the SearchOptions field {name}=")
    unknown = sorted(set(rest) - SEARCH_OPTION_NAMES)
    if unknown:
        forward_inputs = [n for n in unknown if _model_takes(model, n)]
        if forward_inputs:
            raise Unsupported(f"model inputs {forward_inputs} are not passed on by beamkit.hf")
        raise TypeError(
            f"generate() got unexpected keyword arguments {unknown}: neither Hugging Face settings beamkit.hf "
            "maps nor beamkit.SearchOptions fields"
        )
    return prefix_fn


def _tokens(gc: Any, cfg: Any, encoder_decoder: bool, width: int) -> dict[str, Any]:
    """The stop tokens ``eos``, the ``pad`` id (``eos[0]`` when unset, as Hugging Face does with a warning), the
    decoder's ``start`` token and the ``prompt_len`` lengths count from (the prompt's ``width`` for a
    decoder-only model, the start token for an encoder-decoder one)."""
    eos = _eos_list(gc.eos_token_id)
    pad = gc.pad_token_id
    if pad is None and eos:
        pad = eos[0]
    start = 0  # decoder-only: ignored, the first call runs the prompt
    prompt_len = width
    if encoder_decoder:
        start_id = gc.decoder_start_token_id
        if start_id is None:
            start_id = getattr(cfg, "decoder_start_token_id", None)
        if start_id is None:
            raise ValueError("encoder-decoder model without decoder_start_token_id; pass decoder_start_token_id=")
        start, prompt_len = int(_eos_list(start_id)[0]), 1
    return {"eos": eos, "pad": None if pad is None else int(pad), "start": start, "prompt_len": prompt_len}


def _lengths(
    cfg: Any, gc: Any, given: set[str], prompt_len: int, encoder_decoder: bool, eos: tuple[int, ...]
) -> dict[str, Any]:
    """``max_new_tokens`` and ``min_new_tokens`` (0 without stop tokens), checked against the model's learned
    positions; Hugging Face's warning for lengths that cannot be met."""
    max_new = _max_new_tokens(cfg, gc, given, prompt_len, encoder_decoder)
    positions = getattr(cfg, "n_positions", None)  # learned absolute positions (GPT-2 style): a hard limit
    if positions is not None and not encoder_decoder:
        _check_positions(int(positions), prompt_len, max_new, gc, given)
    _warn_unfeasible_lengths(gc, prompt_len, max_new)
    min_new = _min_new_tokens(gc, prompt_len) if eos else 0
    return {"max_new_tokens": max_new, "min_new_tokens": min_new}


def _variants(gc: Any, num_beams: int) -> dict[str, Any]:
    """Diverse beam search (``num_beam_groups``, ``diversity_penalty``) and constrained beam search
    (``force_words_ids``), which cannot be combined."""
    groups = _int(gc.num_beam_groups, "num_beam_groups", 1)
    force_words = gc.force_words_ids
    if groups > 1 and force_words:
        raise ValueError("num_beam_groups and force_words_ids cannot be combined")
    if groups > 1 and num_beams % groups:
        raise ValueError(f"num_beams ({num_beams}) must be a multiple of num_beam_groups ({groups})")
    force = tuple(force_words) if force_words else None
    return {"groups": groups, "diversity": float(gc.diversity_penalty or 0.0), "force_words": force}


def _processor_settings(gc: Any) -> dict[str, Any]:
    """The settings of the logits processors: n-gram blocking, repetition penalty, bad words, suppressed
    tokens, sequence bias, forced first / last tokens (a token both forced and suppressed is refused)."""
    forced_bos = None if gc.forced_bos_token_id is None else int(gc.forced_bos_token_id)
    forced_eos = _eos_list(gc.forced_eos_token_id) or None
    suppress = None if gc.suppress_tokens is None else _token_ids(gc.suppress_tokens, "suppress_tokens")
    if suppress is not None:
        forced = set(forced_eos or ()) | ({forced_bos} if forced_bos is not None else set())
        clash = sorted(forced & set(suppress))
        if clash:
            raise ValueError(f"suppress_tokens {clash} are also forced (forced_bos_token_id / forced_eos_token_id)")
    begin = gc.begin_suppress_tokens
    return {
        "no_repeat_ngram": _int(gc.no_repeat_ngram_size, "no_repeat_ngram_size", 0),
        "repetition_penalty": float(1.0 if gc.repetition_penalty is None else gc.repetition_penalty),
        "bad_words": _bad_words(gc.bad_words_ids),
        "suppress": suppress,
        "begin_suppress": None if begin is None else _token_ids(begin, "begin_suppress_tokens"),
        "sequence_bias": None if gc.sequence_bias is None else _sequence_biases(gc.sequence_bias),
        "forced_bos": forced_bos,
        "forced_eos": forced_eos,
    }


def _sampling(gc: Any, num_beams: int, eos: tuple[int, ...]) -> dict[str, Any]:
    """``do_sample`` and its warpers with Hugging Face 5.x's defaults (``top_k`` 50 when unset)."""
    if not gc.do_sample:
        return {}
    if num_beams > 1 and len(eos) > 1:
        raise Unsupported("do_sample=True with num_beams > 1 and several eos ids (Hugging Face draws more candidates)")
    temperature = float(1.0 if gc.temperature is None else gc.temperature)
    check_float("temperature (with do_sample=True)", temperature, above=0)
    top_k = check_int("top_k", 50 if gc.top_k is None else gc.top_k, 0)
    top_p = check_float("top_p", 1.0 if gc.top_p is None else gc.top_p, above=0, most=1)
    return {"do_sample": True, "temperature": temperature, "top_k": top_k, "top_p": top_p}


def _int(value: Any, name: str, default: int) -> int:
    """``value`` as an int (``default`` for None); TypeError naming ``name`` for a non-integer."""
    return default if value is None else check_int(name, value)


def _max_new_tokens(cfg: Any, gc: Any, given: set[str], prompt_len: int, encoder_decoder: bool) -> int:
    """Hugging Face 5.x: ``max_new_tokens`` wins; else ``max_length``, which counts the prompt (decoder-only) or
    the start token; with neither, 20 new tokens within ``max_position_embeddings``."""
    if gc.max_new_tokens is not None:
        return check_int(_length_setting(gc, given, "max_new_tokens"), _int(gc.max_new_tokens, "max_new_tokens", 0), 1)
    if gc.max_length is not None:
        total = _int(gc.max_length, "max_length", 0)
        if total - prompt_len < 1:
            counted = "the start token" if encoder_decoder else f"the prompt ({prompt_len} tokens)"
            raise ValueError(
                f"{_length_setting(gc, given, 'max_length')}={total} leaves no room for new tokens: it counts "
                f"{counted}; pass a larger max_length or max_new_tokens="
            )
        return total - prompt_len
    total = 20 + prompt_len
    positions = getattr(cfg, "max_position_embeddings", None)
    if positions is not None:
        total = min(total, int(positions))
    if total - prompt_len < 1:
        raise ValueError(
            f"the prompt ({prompt_len} tokens) fills the model's max_position_embeddings={positions}: no room for "
            "new tokens"
        )
    return total - prompt_len


def _check_positions(positions: int, prompt_len: int, max_new: int, gc: Any, given: set[str]) -> None:
    """ValueError unless the prompt and the new tokens fit the model's ``n_positions`` (the last new token is
    never fed back, so ``prompt_len + max_new - 1`` positions are used)."""
    if prompt_len > positions:
        raise ValueError(
            f"the prompt ({prompt_len} tokens) is longer than the model's n_positions={positions}: shorten it; no "
            "max_new_tokens or max_length makes room"
        )
    if prompt_len + max_new - 1 <= positions:
        return
    fit = positions - prompt_len + 1
    if gc.max_new_tokens is not None:
        setting = f"{_length_setting(gc, given, 'max_new_tokens')}={max_new}"
    else:
        setting = f"{_length_setting(gc, given, 'max_length')}={gc.max_length}"
    raise ValueError(
        f"{setting} asks for {max_new} new tokens after a prompt of {prompt_len}, but the model has "
        f"n_positions={positions}: at most {fit} new tokens fit (max_new_tokens <= {fit}, or max_length <= "
        f"{positions + 1})"
    )


def _warn_unfeasible_lengths(gc: Any, prompt_len: int, max_new: int) -> None:
    """Hugging Face 5.x's warnings (its wording, UserWarning) when the minimum length is beyond the maximum: the
    tokens stop at the maximum. Lengths count the prompt (decoder-only) or the start token."""
    max_length = prompt_len + max_new
    suffix = (
        " Generation will stop at the defined maximum length. You should decrease the minimum length and/or "
        "increase the maximum length."
    )
    if gc.max_length is None:  # Hugging Face's "default max_length": neither set nor in a generation config
        suffix += f" Note that `max_length` is set to {max_length}, its default value."
    min_new = gc.min_new_tokens
    min_length = gc.min_length if min_new is None else _int(min_new, "min_new_tokens", 0) + prompt_len
    if min_length is not None and _int(min_length, "min_length", 0) > max_length:
        warnings.warn(
            f"Unfeasible length constraints: `min_length` ({min_length}) is larger than the maximum possible length "
            f"({max_length})." + suffix,
            UserWarning,
            stacklevel=4,
        )
    if min_new is not None and min_length > max_length:
        warnings.warn(
            f"Unfeasible length constraints: `min_new_tokens` ({min_new}), when added to the prompt length "
            f"({prompt_len}), is larger than the maximum possible length ({max_length})." + suffix,
            UserWarning,
            stacklevel=4,
        )


def _min_new_tokens(gc: Any, prompt_len: int) -> int:
    """Hugging Face 5.x: ``min_new_tokens`` replaces ``min_length``, which counts the prompt."""
    if gc.min_new_tokens is not None:
        return max(0, _int(gc.min_new_tokens, "min_new_tokens", 0))
    return max(0, _int(gc.min_length, "min_length", 0) - prompt_len)


def _model_takes(model: Any, name: str) -> bool:
    """Whether ``name`` is a keyword of the model's forward (a model input Hugging Face would pass on)."""
    from beamkit.hf.steps.step import accepts

    return accepts(model, name)
