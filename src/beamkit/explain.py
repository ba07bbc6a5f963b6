"""Decode one input with tracing on (the beam search's own record, ``record_trace=True``, not a re-run), with the
greedy decode of the same input (a beam of one) set along it, and draw it (:func:`render`). Every ``--model``
kind is explained the same way, through :mod:`beamkit.adapters`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from beamkit.trace import Trace

FORMATS = ("html", "svg", "dot", "json")


MAX_BEAM = 256  # the widest beam drawn: a beam of 256 is some 30,000 nodes, already more than a page shows


def explain(
    model: Any,
    text: str,
    beam_size: int = 5,
    length_penalty: float | None = None,
    max_len: int | None = None,
    policy: str | None = None,
) -> Trace:
    """The trace of ``model`` (an adapter of :mod:`beamkit.adapters`, or a ``--model`` spec it loads) decoding
    ``text`` with a beam of ``beam_size``, with the greedy decode's tokens, the source and the token texts set.

    ``length_penalty`` / ``max_len`` None: the model's own. ``policy``: the search policy of a beamkit checkpoint
    (default ``"narrow"``); a model whose offline decoder fixes its policy (a Hugging Face model: ``"pool"``, as
    ``generate``) refuses another."""
    from beamkit._checks import check_int
    from beamkit.adapters import HF_PREFIX, Ask, ModelAdapter, load, search
    from beamkit.adapters.driver import check_prompt_length

    check_int("--beam", beam_size, least=1, most=MAX_BEAM)
    if policy is not None and isinstance(model, str) and model.startswith(HF_PREFIX):  # before the folder loads
        raise ValueError(
            "--policy: a Hugging Face model decodes with the 'pool' policy, as generate does; leave it out"
        )
    adapter = model if isinstance(model, ModelAdapter) else load(model)
    fixed = adapter.engine_options.policy
    if policy is not None and fixed is not None and policy != fixed:
        raise ValueError(
            f"--policy: this model decodes with the {fixed!r} policy, as its own decoder does; leave it out"
        )
    shared: dict[str, Any] = {} if policy is None else {"policy": policy}
    ids = adapter.encode(text)
    check_prompt_length(adapter, ids, "the input")
    runs = []
    for beam, trace in ((beam_size, True), (1, False)):
        ask = Ask(beam, beam, max_len, length_penalty, prompt_len=len(ids))  # the whole final beam
        result = search(adapter, [ids], ask, record_trace=trace, **shared)
        if result.errors:
            raise ValueError(result.errors[0])
        runs.append(result)
    beam_run, greedy_run = runs
    if not beam_run.trace or beam_run.trace[0] is None:
        raise ValueError("this search kept no trace")
    out = beam_run.trace[0].with_vocab(adapter.vocab)
    out.greedy = list(greedy_run.hypotheses[0][0].tokens)
    out.source = text
    if beam_run.hypotheses and beam_run.hypotheses[0]:
        out.best_text = adapter.decode(beam_run.hypotheses[0][0].tokens)
    return out


def explain_dates(
    text: str,
    model: Any = None,
    beam_size: int = 5,
    length_penalty: float = 1.0,
    max_len: int | None = None,
    policy: str = "narrow",
) -> Trace:
    """:func:`explain` for a beamkit checkpoint: ``model`` is a shipped name, a checkpoint path, None (the default
    model) or a loaded model (:func:`beamkit.models.load_model`)."""
    from beamkit.adapters import CheckpointAdapter

    if model is not None and not isinstance(model, (str, Path)):
        model = CheckpointAdapter(model, getattr(model, "name", "model"))
    elif model is not None:
        model = str(model)
    return explain(model, text, beam_size, length_penalty, max_len, policy)


def explain_hf(
    text: str, folder: str, beam_size: int = 5, length_penalty: float = 1.0, max_new_tokens: int | None = None
) -> Trace:
    """:func:`explain` for the Hugging Face model folder ``folder`` (``--model hf:FOLDER``)."""
    return explain(f"hf:{folder}", text, beam_size, length_penalty, max_new_tokens)


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
