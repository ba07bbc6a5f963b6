"""The one batched text driver: texts in, each one's n-best out (:class:`TextHypothesis`), through one engine search
per batch. Every command, the corpus runs, :func:`beamkit.adapters.translate` and
:func:`beamkit.adapters.g2p.decode_words` decode through :func:`decode_texts`.

Inputs are encoded by the adapter, grouped by :meth:`~beamkit.adapters.ModelAdapter.batch_key` (a Hugging Face
model decodes prompts of one length together: no padding) in their order, and each group is decoded in batches of
``batch_size`` with one :class:`beamkit.BeamSearch` call: the per-request options of
:meth:`~beamkit.adapters.ModelAdapter.request` (a :class:`beamkit.RequestOptions`), the search-wide
ones of ``engine_options`` and :meth:`~beamkit.adapters.ModelAdapter.batch_options` (two
:class:`~beamkit.search.options.SharedOptions`) and the caller's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from beamkit.adapters.base import Ask, ModelAdapter
from beamkit.hypothesis import BatchDecodeError, Hypothesis
from beamkit.progress import Progress
from beamkit.search import SearchResult

# SearchOptions fields that decode_texts takes under its own names
_OWN_NAMES = {"beam_size": "beam", "num_return": "n_best"}


class TextHypothesis(NamedTuple):
    """One hypothesis of one input text: its text, token ids, log-probability, ranking score and whether it ended
    with a stop token (else it ran to the length limit). A CTC decoder's hypothesis (corpus runs) has a text but
    no token ids: ``tokens`` is empty there."""

    text: str
    tokens: list[int]
    logprob: float
    score: float
    finished: bool


def _text_hypothesis(adapter: ModelAdapter, h: Hypothesis) -> TextHypothesis:
    """The :class:`TextHypothesis` of a search's hypothesis: its tokens as ``adapter`` decodes them."""
    return TextHypothesis(adapter.decode(h.tokens), list(h.tokens), float(h.logprob), float(h.score), h.finished)


def search(
    adapter: ModelAdapter,
    prompts: list[list[int]],
    ask: Ask,
    progress: Progress | None = None,
    **shared: Any,
) -> SearchResult:
    """One closed-batch search of ``prompts`` (token ids, one batch) for ``ask``: the adapter's
    :class:`beamkit.RequestOptions` for it over the search-wide options (``engine_options``,
    :meth:`~beamkit.adapters.ModelAdapter.batch_options` and ``shared``: more :class:`beamkit.SearchOptions`
    fields, such as ``record_trace`` or ``policy``). ``progress`` advances by one per prompt as the search runs.
    TypeError for a ``shared`` option the model's decoder sets itself to another value."""
    from beamkit.progress import BatchTicker, Silent
    from beamkit.search import BeamSearch

    request = adapter.request(ask)
    own = adapter.engine_options.updated(adapter.batch_options(prompts, ask))
    taken = own.conflicts(shared)
    if taken:
        raise TypeError(f"{', '.join(taken)}: set by this model's decoder ({adapter.name}); leave it out")
    options = request.search_options(**{**own.given(), **shared})
    ticker = BatchTicker(progress or Silent(), len(prompts), options.max_len)
    with adapter.step_context():
        state = adapter.init_state(prompts)
        result = BeamSearch(options).search(ticker.wrap(adapter.step_fn), state, adapter.bos, adapter.eos or None)
    ticker.done()
    return result


def check_prompt_length(adapter: ModelAdapter, ids: Sequence[int], what: str) -> None:
    """Refuse a prompt longer than the model takes (``adapter.max_prompt_tokens``) before any search runs:
    ValueError naming ``what`` (``"input 3"``), its length and the limit (and what sets it, when the adapter
    says: ``prompt_limit``)."""
    limit = adapter.max_prompt_tokens
    if len(ids) > limit:
        why = f" ({adapter.prompt_limit})" if adapter.prompt_limit else ""
        raise ValueError(f"{what} is {len(ids)} tokens long; this model takes at most {limit}{why}")


def decode_texts(
    adapter: ModelAdapter,
    texts: Sequence[str],
    beam: int = 5,
    n_best: int | None = None,
    max_len: int | None = None,
    length_penalty: float | None = None,
    batch_size: int = 256,
    progress: Progress | None = None,
    **options: Any,
) -> list[list[TextHypothesis]]:
    """Each text's n-best (best first, ``n_best`` of them; default ``beam``), decoded by ``adapter``'s model.

    ``max_len`` / ``length_penalty`` None: the model's own (a checkpoint's ``max_len``; a Hugging Face model's
    generation config). ``options``: more :class:`beamkit.SearchOptions` fields for every search (``policy``,
    ``min_len``, ``processors``, ...), as :func:`beamkit.search_batch` takes them. ``progress`` (a bar from
    :func:`beamkit.progress.progress_bar`) advances by one per text. ValueError / TypeError for a text the model
    cannot take (naming it) or bad settings; :class:`beamkit.BatchDecodeError` when a search fails for some
    input."""
    from beamkit._checks import check_int

    check_int("beam", beam, least=1)
    n_best = beam if n_best is None else check_int("n_best", n_best, least=1, most=beam)
    check_int("batch_size", batch_size, least=1)
    if max_len is not None:
        check_int("max_len", max_len, least=1)
    own = sorted(set(options) & set(_OWN_NAMES))
    if own:
        raise TypeError(f"give {own[0]} as {_OWN_NAMES[own[0]]}= (decode_texts' own argument), not as a search option")
    if isinstance(texts, str):
        raise TypeError("expected a sequence of strings, got one string")
    ids = [adapter.encode(text) for text in texts]
    for i, row in enumerate(ids):
        check_prompt_length(adapter, row, f"input {i + 1}" if len(ids) > 1 else "the input")
    groups: dict[Any, list[int]] = {}
    for i, row in enumerate(ids):
        groups.setdefault(adapter.batch_key(tuple(row)), []).append(i)
    out: list[list[TextHypothesis] | None] = [None] * len(ids)
    for members in groups.values():
        for start in range(0, len(members), batch_size):
            chunk = members[start : start + batch_size]
            prompts = [ids[i] for i in chunk]
            ask = Ask(beam, n_best, max_len, length_penalty, prompt_len=len(prompts[0]))
            result = search(adapter, prompts, ask, progress, **options)
            BatchDecodeError.raise_if(result.errors, result.hypotheses)
            for i, hyps in zip(chunk, result.hypotheses, strict=True):
                out[i] = [
                    TextHypothesis(
                        adapter.decode(h.tokens), list(h.tokens), float(h.logprob), float(h.score), h.finished
                    )
                    for h in hyps[:n_best]
                ]
    return [o if o is not None else [] for o in out]
