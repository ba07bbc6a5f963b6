"""Where one ``generate`` call runs, decided once and as data: :func:`route` returns a :class:`Route`.

Three ways to run a call, tried in this order:

- ``"engine"``: beamkit's engine bridge (:func:`beamkit.hf.bridge.generation.prepare`), the call checked and ready
  (:class:`beamkit.hf.bridge.generation.Prepared`);
- ``"loop"``: beamkit's decoding loop inside Hugging Face's own ``generate`` (:mod:`beamkit.hf.loop`), which
  reproduces Hugging Face's float32 arithmetic (:class:`LoopCall`);
- ``"huggingface"``: Hugging Face's own decoding method (only :func:`beamkit.hf.patch` runs it;
  :func:`beamkit.hf.generate` raises :class:`~beamkit.hf.Unsupported` with the reason instead).

A route names why it was taken (``reason``: why the engine was passed over, or why the loop was), so a table of
calls and their routes can be printed and tested. Input errors are raised, never turned into a route: by the
bridge for :func:`beamkit.hf.generate`, by Hugging Face's own checks for a patched ``model.generate`` (the
bridge's checks are stricter in places; a patched model keeps Hugging Face's errors and serves every call Hugging
Face serves).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch

from beamkit.hf.bridge.generation import Prepared, loop_decodes, prepare, wants_tables
from beamkit.hf.bridge.settings import Settings, is_generation_config, merge_config
from beamkit.hf.errors import Unsupported

RouteKind = Literal["engine", "loop", "huggingface"]
Merged = tuple[Any, dict[str, Any], set[str]]  # merge_config's (generation config, other keywords, names given)
# generate()'s keywords that carry the call's inputs, not generation settings
CALL_INPUTS = ("inputs", "input_ids", "attention_mask", "generation_config")
ENGINE_REASON = "the engine bridge reproduces this call"

# generate()'s arguments that reach only Hugging Face's own decoding methods, never a custom one
HOST_ONLY = ("assistant_model", "streamer", "tokenizer", "assistant_tokenizer", "custom_generate", "synced_gpus")


@dataclass(frozen=True)
class LoopCall:
    """A call for beamkit's loop: Hugging Face's ``generate(*args, **kwargs)`` with the loop as its decoding
    method."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    compile: str | None = None  # the torch.compile backend of the loop's steps (None: eager)

    def __call__(self, generate: Callable[..., Any]) -> Any:
        """Run the call through ``generate`` (the model's unpatched ``generate``). The route has judged the
        call's generation mode already, so the loop only reads it."""
        from beamkit.hf.loop.decoding import decode

        method = functools.partial(decode, compile_backend=self.compile, judged=True)
        return generate(*self.args, custom_generate=method, **self.kwargs)


@dataclass(frozen=True)
class Route:
    """Where a call runs (``kind``), why (``reason``), and the call ready to run there (``prepared``: a
    :class:`~beamkit.hf.bridge.generation.Prepared` for the engine, a :class:`LoopCall` for the loop, None for Hugging
    Face's own, which runs the call as it was made)."""

    kind: RouteKind
    reason: str
    prepared: Prepared | LoopCall | None = None

    def __str__(self) -> str:
        return f"{self.kind}: {self.reason}"


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
    ``exact_exit``, extra ``processors`` applied after the mapped ones, ...), and ``allowed_output`` (with a
    :class:`beamkit.Trie`'s ``prefix_allowed_tokens_fn``: ``"allowed"`` computes the output layer only for the
    ids some row may take and normalises over each row's allowed ids, ``"vocab"`` normalises over the whole
    vocabulary, as Hugging Face does; see :mod:`beamkit.hf.retrieval.allowed`), and ``compile`` (True or a
    ``torch.compile`` backend name runs the decoding steps compiled over static shapes, ``"max-autotune"``
    inductor with its matrix products autotuned and the weights frozen into the graphs, see
    :mod:`beamkit.hf.steps.compiled`; default False; of the calls the loop decodes, Whisper's only).

    Where the call runs is decided once, by :func:`beamkit.hf.bridge.route.route`: the engine bridge where it takes
    the call, else beamkit's decoding loop inside Hugging Face's own ``generate`` (:mod:`beamkit.hf.loop`:
    Whisper and other models with their own ``generate``, inputs other than token ids, model inputs the bridge
    does not pass on, per-step ``scores``).

    Returns the ``sequences`` tensor, or with ``return_dict_in_generate`` Hugging Face's output object with
    beamkit's ``hypotheses`` and ``stats`` added (see :mod:`beamkit.hf.bridge.output`). Raises
    :class:`beamkit.hf.Unsupported` (a ValueError) for settings beamkit.hf does not reproduce exactly, naming
    them; ValueError / TypeError for bad input; :class:`beamkit.BatchDecodeError` when a request fails.
    """
    return run_route(model, route(model, (inputs, second), kwargs))


def run_route(model: Any, chosen: Any, original: Any = None) -> Any:
    """Run a :class:`beamkit.hf.bridge.route.Route` of ``generate``: on the engine, or in beamkit's loop inside the
    model's unpatched ``generate`` (``original`` where given); a route to Hugging Face's own decoding is
    :class:`Unsupported` with its reason (:func:`generate` never runs Hugging Face's own)."""
    if chosen.kind == "engine":
        return chosen.prepared()
    if chosen.kind == "loop":
        return chosen.prepared(original if original is not None else unpatched(model))
    raise Unsupported(chosen.reason)


def unpatched(model: Any) -> Any:
    """The model's ``generate`` without a :func:`beamkit.hf.patch` around it."""
    handle = getattr(getattr(model, "generate", None), "beamkit_patch", None)
    return handle.original if handle is not None else model.generate


def route(
    model: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    patched: bool = False,
    fast: bool = False,
    engine: bool = True,
) -> Route:
    """The route of ``generate(model, *args, **kwargs)``.

    ``patched``: the call is a patched ``model.generate`` (:func:`beamkit.hf.patch`): ``args`` are Hugging
    Face's positionals (inputs, generation config), the engine takes only what it reproduces exactly (no
    per-step score tables, no sampling, and beam search only with ``fast``), and a call the bridge rejects goes
    to the loop, where Hugging Face's own checks decide. Otherwise (:func:`beamkit.hf.generate`) ``args`` are
    the inputs and the attention mask or generation config, and bad input raises ValueError / TypeError naming
    it. ``engine=False`` passes the engine over (a call the engine could not finish). Raises nothing for a call
    beamkit does not reproduce: that is a route."""
    merged = _merged_config(model, args, kwargs)
    why: Prepared | str = "the engine could not decode the call"
    if engine:
        why = _engine_refusal(model, args, kwargs, patched, fast, merged)
    if isinstance(why, Prepared):
        return Route("engine", ENGINE_REASON, why)
    if kwargs.get("allowed_output") is not None:  # beamkit's engine alone computes the output layer that way
        return Route(
            "huggingface", f"allowed_output= runs on beamkit's engine only, which does not take this call: {why}"
        )
    from beamkit.hf.loop.decoding import COMPILES
    from beamkit.hf.steps.direct import FAMILIES
    from beamkit.models.compiled import compile_setting

    kwargs = dict(kwargs)
    backend = compile_setting(kwargs.pop("compile", None))
    if backend is not None and FAMILIES.get(type(model).__name__) not in COMPILES:
        return Route(
            "huggingface",
            f"compile= runs on beamkit's engine only (and for Whisper in beamkit's loop), which does not take this "
            f"call: {why}",
        )
    call = LoopCall(args, kwargs) if patched else _loop_call(args, kwargs)
    call = replace(call, compile=backend)
    refusal = loop_refusal(call, merged[0] if merged is not None else None)
    if refusal is not None:
        return Route("huggingface", refusal)
    return Route("loop", why, call)


def _merged_config(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Merged | None:
    """The call's generation config merged once, as ``model.generate`` merges it (:func:`merge_config`), for both
    the engine bridge and the loop's mode check; None where the call passes something else as its generation
    config (the bridge's checks and Hugging Face's then judge it)."""
    second = args[1] if len(args) > 1 else None
    passed = second if is_generation_config(second) else kwargs.get("generation_config")
    if passed is not None and not is_generation_config(passed):
        return None
    settings = {k: v for k, v in kwargs.items() if k not in CALL_INPUTS}
    return merge_config(passed, model_config(model), settings)


def _engine_refusal(
    model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], patched: bool, fast: bool, merged: Merged | None
) -> Prepared | str:
    """The engine bridge's prepared call, or why it does not take the call (its :class:`Unsupported` message;
    for a patched call, also an input it rejects, which Hugging Face's checks then judge)."""
    if len(args) > 2:
        return "positional arguments after generation_config"
    inputs, second = (*args, None, None)[:2]
    try:
        prepared = prepare(model, inputs, second, kwargs, exact_only=patched, merged=merged)
    except Unsupported as err:  # the bridge's "not reproduced": a route, not an error
        return str(err)
    except (ValueError, TypeError) as err:
        if not patched:
            raise
        return f"the engine bridge rejects the call ({err}); Hugging Face's own checks decide"
    s = prepared.settings
    if not patched and wants_tables(s) and loop_decodes(s):
        return "per-step scores: the loop keeps Hugging Face's tables"
    if patched and not fast and plain_beam_search(s):
        return "beam search: the loop ranks with Hugging Face's float32 sums and tie order (fast=True: the engine)"
    return prepared


def _loop_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> LoopCall:
    """:func:`beamkit.hf.generate`'s call as Hugging Face's ``generate`` takes it: beamkit's second positional
    (an attention mask or a generation config) as the keyword it is."""
    kwargs = dict(kwargs)
    inputs, second = (*args, None, None)[:2]
    if second is not None:
        key = "generation_config" if is_generation_config(second) else "attention_mask"
        if key in kwargs:
            raise TypeError(f"generate() got {key} twice")
        kwargs[key] = second
    return LoopCall(() if inputs is None else (inputs,), kwargs)


def loop_refusal(call: LoopCall, gc: Any) -> str | None:
    """Why beamkit's loop cannot decode ``call``, before Hugging Face's ``generate`` runs (it expands some inputs
    in place, a given ``encoder_outputs``, so a rerun would see them expanded): arguments Hugging Face hands only
    to its own methods, or a generation mode of ``gc`` (the call's merged generation config) the loop does not
    decode; None when it can. Settings Hugging Face rejects are left to its own checks (None: the call raises
    Hugging Face's error in the loop's route)."""
    from beamkit.hf.loop.decoding import mode_refusal

    taken = sorted(n for n in HOST_ONLY if call.kwargs.get(n) not in (None, False))
    if taken or len(call.args) > 2:
        names = ", ".join(f"{n}=" for n in taken) or "positional arguments after generation_config"
        return f"{names}: Hugging Face's generate does not hand it to a custom decoding method"
    return None if gc is None else mode_refusal(gc)


def model_config(model: Any) -> Any:
    """The model's own generation config (None without one)."""
    return getattr(model, "generation_config", None)


def plain_beam_search(settings: Settings) -> bool:
    """Whether the engine bridge would run a plain beam search (not greedy, not diverse or constrained beam
    search, which the loop does not decode)."""
    return settings.num_beams > 1 and settings.groups == 1 and not settings.force_words
