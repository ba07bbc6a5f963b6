"""Hugging Face model folders (``hf:DIR``), decoder-only and encoder-decoder, decoded as
:func:`beamkit.hf.generate` decodes them: the same settings (:func:`beamkit.hf.bridge.settings.resolve` over the model's
generation config), the same search options (:func:`beamkit.hf.bridge.search.request_options` and
:func:`~beamkit.hf.bridge.search.shared_options`), the same step functions.

A decoder-only model's prompt is its input, and decoding continues it; an encoder-decoder model's prompt is the
encoder input, and decoding starts at the decoder start token. Prompts are decoded together only when they have
the same length (no padding), so each gets what it gets decoded alone.

A server's running engine is shared by requests that join it mid-flight. An encoder-decoder model's logits
processors (its generation config's forced start / stop tokens, suppressed and bad words, n-gram blocking) see
only the decoder's tokens, which start at the same token for every request, so they apply per request in the
shared engine too (:class:`SharedProcessors`); a decoder-only model's depend on each prompt, and requests that
need them are refused by :meth:`HFAdapter.continuous_refusal`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from beamkit import ops
from beamkit.adapters.base import Ask, ModelAdapter
from beamkit.scoring import LengthPenalty
from beamkit.search.options import RequestOptions, SharedOptions

# Settings a continuous engine cannot apply per request (they need processors built for one batch of prompts),
# as the generation-config fields users know them by.
PROCESSOR_FIELDS = {
    "sequence_bias": "sequence_bias",
    "repetition_penalty": "repetition_penalty",
    "no_repeat_ngram": "no_repeat_ngram_size",
    "bad_words": "bad_words_ids",
    "forced_bos": "forced_bos_token_id",
    "forced_eos": "forced_eos_token_id",
    "suppress": "suppress_tokens",
    "begin_suppress": "begin_suppress_tokens",
}


@contextlib.contextmanager
def _no_loading_bars() -> Iterator[None]:
    """transformers' progress bars ("Loading weights") off while a folder loads: a command's standard error
    keeps to its own lines (and to its own bar, shown on a terminal only)."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


class HFAdapter(ModelAdapter):
    """A Hugging Face model folder with its tokenizer (loaded by :func:`beamkit.hf.load_pretrained`).
    ``compile``: the bridge steps' ``compile=`` (:class:`beamkit.hf.DecoderOnlyStep`,
    :class:`beamkit.hf.EncoderDecoderStep`)."""

    owned_by = "huggingface"

    def __init__(
        self, directory: str | Path, name: str | None = None, allow_pickle: bool = False, compile: bool | str = False
    ):
        from beamkit.hf import DecoderOnlyStep, EncoderDecoderStep, load_pretrained

        with _no_loading_bars():
            loaded = load_pretrained(directory, allow_pickle=allow_pickle)
        base = self._describe(
            loaded.model, loaded.tokenizer, loaded.config, loaded.encoder_decoder, loaded.folder, name
        )
        # decoder-only: keys/values paged (one pool for every request served) unless the generation config asks
        # for one of Hugging Face's caches (cache_implementation="dynamic" and the like: the dense bridge) or the
        # steps are compiled (their own static buffers)
        self._step: Any = (
            EncoderDecoderStep(self.model, compile=compile)
            if self.encoder_decoder
            else DecoderOnlyStep(self.model, kv=base.kv, compile=compile)
        )

    def _describe(
        self, model: Any, tokenizer: Any, config: Any, encoder_decoder: bool, folder: Path, name: str | None
    ) -> Any:
        """Take the loaded model, tokenizer and config, and set what the commands and the server read of them
        (name, stop and start tokens, prompt and output limits, the search-wide options); the settings of a plain
        one-beam ask, returned for the step's choices."""
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.encoder_decoder = encoder_decoder
        self.vocab = self.tokenizer
        self._resolved: OrderedDict[Ask, Any] = OrderedDict()  # settings by ask (see settings)
        self._resolved_lock = threading.Lock()
        self.name = name or folder.name or str(folder)
        base = self.settings(Ask(beam=1, n_best=1, max_len=1))
        self.eos = base.eos
        self.bos = base.start  # decoder-only: ignored, the first call runs the prompt
        self.engine_options = SharedOptions(policy="pool")
        found = getattr(self.config, "max_position_embeddings", None) or getattr(self.config, "n_positions", None)
        positions = int(found) if found is not None else 1024
        self.max_prompt_tokens = positions if self.encoder_decoder else positions - 1
        self.max_tokens_limit = positions if self.encoder_decoder else positions - 1
        self.context = None if self.encoder_decoder else positions
        self.default_max_tokens = 16  # the OpenAI completions default (a server's; the commands ask for 20)
        return base

    def settings(self, ask: Ask) -> Any:
        """The :class:`beamkit.hf.Settings` that ``beamkit.hf.generate`` resolves for these arguments over the
        model's generation config (None: the config's value, else Hugging Face's default). Resolved once per
        ask: a served request's options and its refusal check read the same settings (the last
        :data:`_RESOLVED_KEPT` asks are kept)."""
        with self._resolved_lock:
            kept = self._resolved.get(ask)
            if kept is not None:
                self._resolved.move_to_end(ask)
                return kept
        settings = self._resolve(ask)
        with self._resolved_lock:
            self._resolved[ask] = settings
            while len(self._resolved) > _RESOLVED_KEPT:
                self._resolved.popitem(last=False)
        return settings

    def _resolve(self, ask: Ask) -> Any:
        from beamkit.hf.bridge.settings import merge_config, resolve

        kwargs = {
            "num_beams": ask.beam,
            "num_return_sequences": ask.n_best,
            "max_new_tokens": ask.max_len,
            "length_penalty": ask.length_penalty,
            "early_stopping": ask.early_stopping,
            "min_new_tokens": ask.min_len,
        }
        gc, rest, given = merge_config(None, self.model.generation_config, kwargs)
        return resolve(self.model, gc, rest, given, 1 if self.encoder_decoder else ask.prompt_len)

    def request(self, ask: Ask) -> RequestOptions:
        """``generate``'s per-request options: greedy search (one beam) stops at the first finished hypothesis,
        ``max_len`` None is the generation config's length (else 20 new tokens), ``min_len`` None its minimum."""
        from beamkit.hf.bridge.search import request_options

        return request_options(self.settings(ask))

    def batch_options(self, prompts: Sequence[Sequence[int]], ask: Ask) -> SharedOptions:
        """The logits processors ``generate`` builds for these prompts (from the generation config), with greedy
        search processing raw logits where that changes the scores; the rest of the shared options (sampling,
        diverse or constrained search) is refused, naming the setting."""
        from beamkit.hf.bridge.processors import build_processors
        from beamkit.hf.errors import Unsupported

        s = self.settings(ask)
        for field, used in (("do_sample", s.do_sample), ("num_beam_groups", s.groups > 1)):
            if used:
                raise Unsupported(f"generation_config.{field} is not decoded by beamkit's commands (use beamkit.hf)")
        if s.force_words:
            raise Unsupported("generation_config.force_words_ids is not decoded by beamkit's commands (use beamkit.hf)")
        rows = [[s.start] for _ in prompts] if self.encoder_decoder else [list(p) for p in prompts]
        processors = build_processors(s, tuple(tuple(r) for r in rows), [0] * len(rows))
        if not processors and not (s.num_beams == 1 and s.min_new_tokens > 0):
            return SharedOptions()  # raw logits or log-probabilities: the same scores when nothing changes them
        return SharedOptions(processors=tuple(processors), process_logits=s.num_beams == 1)

    def continuous_options(self) -> SharedOptions:
        """The search-wide options of a running engine shared by requests (a server's): :attr:`engine_options`,
        and for an encoder-decoder model the generation config's logits processors, applied per request
        (:class:`SharedProcessors`; a new one each call, for one engine)."""
        if not self.encoder_decoder:
            return self.engine_options
        from beamkit.hf.bridge.processors import build_processors

        # the longest request any engine could hold: the forced stop token is moved to each request's own last step
        s = self.settings(Ask(beam=2, n_best=1, max_len=_NO_LIMIT))
        processors = build_processors(s, ((s.start,),), [0])
        shared = SharedProcessors(processors, s.forced_eos, _NO_LIMIT - 1)
        return self.engine_options.updated(SharedOptions(processors=(shared,)))

    def continuous_refusal(self, ask: Ask) -> str | None:
        """Why a running engine shared by other requests cannot decode ``ask`` as ``generate`` would: the
        generation-config settings that need processors built for one batch of prompts, or greedy search with a
        minimum length (``generate`` renormalises its raw logits then); None when it can. An encoder-decoder
        model's engine applies them per request (:meth:`continuous_options`), except a repetition penalty with a
        beam of one (``generate`` scales raw logits then, not log-probabilities)."""
        s = self.settings(ask)
        if self.encoder_decoder:
            if s.num_beams == 1 and s.repetition_penalty != 1.0:
                return (
                    "generation_config.repetition_penalty with a beam of one: not applied to requests that share "
                    "a running engine (ask for 'best_of' 2 or more)"
                )
            return None
        names = [f"generation_config.{field}" for attr, field in PROCESSOR_FIELDS.items() if _set(getattr(s, attr))]
        if not self.encoder_decoder and "generation_config.forced_bos_token_id" in names:
            names.remove("generation_config.forced_bos_token_id")  # applies to encoder-decoder models only
        if s.num_beams == 1 and s.min_new_tokens > 0:
            names.append("'min_tokens' with a beam of one")
        if not names:
            return None
        return f"{', '.join(names)}: not applied to requests that share a running engine"

    def step_fn(self, state: Any, y_prev: Any) -> Any:
        """The bridge's step: the prompt (or the encoder) runs once per request, then one token per row. The
        bridge's per-call row counts are not kept (the engine counts calls and rows; a server runs for ever)."""
        out = self._step(state, y_prev)
        self._step.stats.rows_per_call.clear()
        return out

    def encode(self, prompt: str) -> list[int]:
        """The tokenizer's ids (with its special tokens, as ``tokenizer(prompt)`` gives them)."""
        ids = [int(i) for i in self.tokenizer(prompt)["input_ids"]]
        if not ids:
            raise ValueError("empty input: the tokenizer gives no tokens for it")
        return ids

    def init_state(self, prompts: list[list[int]]) -> Any:
        """The bridge's initial state for prompts of one length (no padding), on the model's device."""
        from beamkit.hf.bridge.inputs import prompt_batch

        return self._step.init_state(*prompt_batch(prompts, getattr(self.model, "device", None)))

    def batch_key(self, ids: tuple[int, ...]) -> Any:
        """Prompts join in one call only when they have the same length (no padding, as alone)."""
        return len(ids)

    def decode(self, tokens: Sequence[int]) -> str:
        """The tokenizer's text of the generated tokens, the trailing stop token and special tokens dropped."""
        tokens = list(tokens)
        if tokens and tokens[-1] in self.eos:
            tokens = tokens[:-1]
        return str(self.tokenizer.decode(tokens, skip_special_tokens=True))

    def token_text(self, token: int) -> str:
        """The tokenizer's text of one token."""
        return str(self.tokenizer.decode([int(token)]))

    def length_penalty(self, alpha: float) -> LengthPenalty:
        """Hugging Face's ``logprob / len ** alpha``."""
        return LengthPenalty.power(alpha)

    @contextlib.contextmanager
    def step_context(self) -> Iterator[None]:
        """Torch's inference mode."""
        from beamkit import ops

        with ops.inference_mode(True):
            yield


_NO_LIMIT = 1 << 30  # generated tokens: more than any request asks for
_RESOLVED_KEPT = 64  # resolved settings kept per model (by ask)


class SharedProcessors:
    """An encoder-decoder model's logits processors in an engine shared by requests that join mid-flight, each
    request processed as ``generate`` processes it alone.

    ``processors`` were built for one request (their decoder prompt is the start token, the same for every
    request, so each row is processed as its request alone: the rows are passed as if of request 0); the one
    that forces ``forced_eos`` at generated step ``built_last`` is applied instead at each request's own last step
    (its ``max_len`` - 1). Rows of greedy requests (a beam of one) are renormalised after the processors, as
    ``generate`` does when it processes raw logits. Each row's request options come from the step's context
    (``StepContext.max_len``, ``StepContext.beam``).
    """

    def __init__(self, processors: list[Any], forced_eos: tuple[int, ...] | None, built_last: int):
        self.forced_eos = tuple(forced_eos) if forced_eos else ()
        self.before: list[Any] = []
        self.after: list[Any] = []
        side = self.before
        for proc in processors:
            if self.forced_eos and getattr(proc, "step", None) == built_last:
                side = self.after  # the forced stop token: per request, in its place in the order
                continue
            side.append(proc)

    def __call__(self, scores: Any, ctx: Any) -> Any:
        """Process one run of rows (one step, one beam width): the shared processors, the forced stop token at
        each row's last step, a greedy row's renormalisation."""
        if ctx.max_len is None or ctx.beam is None:
            raise ValueError("SharedProcessors needs each row's max_len and beam (StepContext), as an Engine gives")
        alone = dataclasses.replace(ctx, request=np.zeros_like(ctx.request))  # every row as request 0's
        for proc in self.before:
            scores = proc(scores, alone)
        if self.forced_eos:
            last = np.flatnonzero(ctx.max_len - 1 == ctx.step)  # shape: (forced rows,)
            if last.size:
                eos = np.asarray(self.forced_eos, dtype=np.int64)
                scores = ops.keep_only(scores, last, np.full(last.size, eos[0]))
                scores = ops.fill(scores, np.repeat(last, eos.size), np.tile(eos, last.size), 0.0)
        for proc in self.after:
            scores = proc(scores, alone)
        if ctx.request.size and int(ctx.beam[0]) == 1:  # a run of rows has one beam width
            scores = ops.log_softmax(scores)  # shape: (rows, V)
        return scores


def _set(value: Any) -> bool:
    """Whether a :class:`beamkit.hf.Settings` field is set away from its neutral value."""
    return value not in (None, (), 0, 1.0, False)
