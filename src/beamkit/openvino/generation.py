"""``beamkit.openvino.generate``: what ``beamkit.hf.generate`` does, over an OpenVINO IR folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from beamkit._checks import check_bool
from beamkit.openvino.model import Model, check_precision, require


def as_model(model: Any) -> Model:
    """``model`` as a :class:`Model`: itself, or the IR folder it names (read once here)."""
    if isinstance(model, Model):
        return model
    if isinstance(model, (str, Path)):
        return Model(model)
    raise TypeError(f"model must be an OpenVINO IR folder or a beamkit.openvino.Model, got {type(model).__name__}")


def generate(
    model: Any,
    input_ids: Any = None,
    attention_mask: Any = None,
    *,
    precision: str = "f32",
    threads: int | None = None,
    shared_prompt: bool = False,
    **kwargs: Any,
) -> Any:
    """Decode with beamkit's engine over an OpenVINO IR and return what :func:`beamkit.hf.generate` returns.

    ``model``: an IR folder (optimum-intel's layout, see :class:`beamkit.openvino.Model`) or a loaded
    :class:`~beamkit.openvino.Model`. ``input_ids`` / ``attention_mask``: left-padded prompts ``[batch, P]``
    (torch tensors; the mask is inferred from ``pad_token_id`` when omitted). ``precision``: ``"f32"`` (float32
    inference and key/value cache: Hugging Face's float32 results), ``"bf16"`` or ``"auto"`` (OpenVINO's CPU
    defaults); ``threads``: OpenVINO's inference threads (None: its default). ``shared_prompt=True`` decodes on the
    folder's shared-prompt IR (``export_decoder(..., shared_prompt=True)``): each request's prompt keys/values are
    held once however many beams read them (:mod:`beamkit.openvino.shared`). Every other keyword is what
    ``beamkit.hf.generate`` takes (beams, lengths, penalties, processors, n-best, sampling, constraints,
    ``prefix_allowed_tokens_fn``, ``return_dict_in_generate``, ``beamkit.SearchOptions`` fields), read over the
    folder's ``generation_config.json``; ``compile=`` and ``allowed_output=`` are for torch models and refused.

    Raises ValueError / TypeError for bad input (an unknown precision, a folder that is not an IR, beam search
    on a stateful IR without ``beam_idx``), :class:`beamkit.hf.Unsupported` for settings the bridge does not
    reproduce, :class:`beamkit.BatchDecodeError` when a request fails.
    """
    require()
    check_precision(precision)
    check_bool("shared_prompt", shared_prompt)
    prepared = prepare_call(as_model(model), input_ids, attention_mask, kwargs)
    return run_call(prepared, precision, threads, shared_prompt)


def prepare_call(model: Model, inputs: Any, attention_mask: Any, kwargs: dict[str, Any]) -> Any:
    """The call checked and its settings resolved, as ``beamkit.hf.generate`` does: a
    :class:`beamkit.hf.bridge.generation.Prepared`."""
    from beamkit.hf.bridge.generation import Prepared, rows_to_decode
    from beamkit.hf.bridge.inputs import check_input_ids
    from beamkit.hf.bridge.settings import is_generation_config, merge_config, resolve
    from beamkit.hf.errors import Unsupported

    kwargs = dict(kwargs)
    for name in ("compile", "allowed_output"):
        if kwargs.get(name) not in (None, False):
            raise Unsupported(
                f"{name}= is for torch models (beamkit.hf.generate); an OpenVINO IR is compiled by OpenVINO"
            )
        kwargs.pop(name, None)
    if "inputs" in kwargs:
        if inputs is not None:
            raise TypeError("generate() got the inputs twice (positional and inputs=)")
        inputs = kwargs.pop("inputs")
    if is_generation_config(attention_mask):  # Hugging Face's second positional argument
        if "generation_config" in kwargs:
            raise TypeError("generate() got generation_config twice")
        kwargs["generation_config"], attention_mask = attention_mask, None
    passed = kwargs.pop("generation_config", None)
    gc, rest, given = merge_config(passed, model.generation_config, kwargs)
    input_ids = check_input_ids(inputs, model)
    settings = resolve(model, gc, rest, given, input_ids.shape[1])
    beams = settings.num_beams > 1 or settings.groups > 1 or bool(settings.force_words)
    if beams and model.stateful and not model.reorders:
        raise ValueError(
            f"{model.path} is a stateful IR without a beam_idx input: its rows cannot be reordered, so it decodes "
            "greedily only (num_beams=1); export it with beam_idx (optimum-cli export openvino, or "
            "beamkit.openvino.export_decoder) for beam search"
        )
    return Prepared(model, *rows_to_decode(input_ids, attention_mask, settings, model.vocab_size))


def run_call(prepared: Any, precision: str, threads: int | None, shared_prompt: bool = False) -> Any:
    """Run a prepared call on beamkit's engine over the IR compiled at ``precision`` / ``threads`` (the
    shared-prompt IR with ``shared_prompt``)."""
    import torch

    from beamkit.hf.bridge.generation import prompt_processors, request_seeds
    from beamkit.hf.bridge.output import build_output
    from beamkit.hf.bridge.search import run_search
    from beamkit.openvino.seq2seq import make_step

    model, input_ids, mask, settings = prepared.model, prepared.input_ids, prepared.mask, prepared.settings
    step = make_step(model, precision, threads, shared_prompt)
    batch = input_ids.shape[0]
    prefix = input_ids
    if settings.encoder_decoder:  # the decoder starts from the start token; the inputs go to the encoder
        prefix = torch.full((batch, 1), settings.start, dtype=torch.long)
    processors = prompt_processors(settings, prefix, mask)
    state = step.init_state(input_ids.cpu(), mask.cpu())
    seeds = request_seeds(input_ids, mask) if settings.do_sample else None
    with torch.inference_mode():
        hyps, traces = run_search(step, state, settings, batch, processors, seeds)
    return build_output(settings, prefix, hyps, step.stats, step.forward_seconds, traces)
