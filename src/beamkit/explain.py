"""Decode one input with tracing on (the beam search's own record, ``record_trace=True``, not a re-run), with the
greedy decode of the same input (a beam of one) set along it, and draw it (:func:`render`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from beamkit.extras import install_hint
from beamkit.trace import Trace

FORMATS = ("html", "svg", "dot", "json")


def explain_dates(
    text: str,
    model: Any = None,
    beam_size: int = 5,
    length_penalty: float = 1.0,
    max_len: int | None = None,
    policy: str = "narrow",
) -> Trace:
    """The trace of a dates model (a shipped name, a checkpoint path or a loaded model) decoding ``text``, with
    the greedy decode's tokens and the target vocabulary set."""
    from beamkit.models import load_model
    from beamkit.models.common import encode_sources, inference, model_inputs, pad_batch
    from beamkit.search import BeamSearch, make_options

    net = model if model is not None and not isinstance(model, (str, Path)) else load_model(model)
    limit = int(max_len if max_len is not None else getattr(net, "meta", {}).get("max_len", 12))
    src, lengths = pad_batch(encode_sources(net.src_vocab, [text]), net.src_vocab.pad)
    tv = net.tgt_vocab
    runs = []
    with inference(net):
        for beam, trace in ((beam_size, True), (1, False)):
            state = net.init_state(*model_inputs(net, src, lengths))
            opts = make_options(beam, limit, length_penalty=length_penalty, policy=policy, record_trace=trace)
            result = BeamSearch(opts).search(net.step, state, tv.bos, tv.eos)
            if result.errors:
                raise ValueError(result.errors[0])
            runs.append(result)
    beam_run, greedy_run = runs
    assert beam_run.trace is not None and beam_run.trace[0] is not None
    out = beam_run.trace[0].with_vocab(tv)
    out.greedy = list(greedy_run.hypotheses[0][0].tokens)
    out.source = text
    return out


def explain_hf(
    text: str, folder: str, beam_size: int = 5, length_penalty: float = 1.0, max_new_tokens: int | None = None
) -> Trace:
    """The trace of a Hugging Face model folder (model and tokenizer, loaded offline) generating from ``text``
    with :func:`beamkit.hf.generate`, with its greedy decode set."""
    if not Path(folder).is_dir():
        raise FileNotFoundError(f"no Hugging Face model folder at {folder!r}")
    try:
        import transformers
    except ImportError as exc:
        raise ImportError(f"explain --model hf:DIR needs transformers: {install_hint('hf')} ({exc})") from exc
    from beamkit.hf import generate

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    auto = transformers.AutoModelForSeq2SeqLM if config.is_encoder_decoder else transformers.AutoModelForCausalLM
    model = auto.from_pretrained(folder, local_files_only=True).eval()
    enc = tokenizer([text], return_tensors="pt")
    common: dict[str, Any] = {"max_new_tokens": max_new_tokens, "length_penalty": length_penalty}
    ids, mask = enc["input_ids"], enc.get("attention_mask")
    beam = generate(model, ids, mask, num_beams=beam_size, record_trace=True, return_dict_in_generate=True, **common)
    greedy = generate(model, ids, mask, num_beams=1, return_dict_in_generate=True, **common)
    if not beam.trace or beam.trace[0] is None:
        raise ValueError("this search kept no trace (diverse and constrained searches are not traced)")
    out = beam.trace[0].with_vocab(tokenizer)
    out.greedy = list(greedy.hypotheses[0][0].tokens)
    out.source = text
    return out


def render(trace: Trace, fmt: str) -> str:
    """``trace`` in one of :data:`FORMATS`."""
    from beamkit.viz import to_dot, to_html, to_svg

    if fmt == "html":
        return to_html(trace)
    if fmt == "svg":
        return to_svg(trace)
    if fmt == "dot":
        return to_dot(trace)
    if fmt == "json":
        return trace.to_json(indent=1) + "\n"
    raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
