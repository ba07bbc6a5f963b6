"""beamkit's decoding loop inside Hugging Face's own ``generate``: the calls beamkit's engine bridge does not take.

``model.generate(..., custom_generate=beamkit.hf.loop.decode)`` lets Hugging Face prepare the call exactly as it
always does (its input checks, ``inputs_embeds`` / ``encoder_outputs`` / ``decoder_input_ids`` / ``token_type_ids``
and every other model input, the cache it builds or the one given, its logits processors and stopping criteria,
Whisper's language / task / timestamp handling), then hands the decoding to :func:`decode`. The loop keeps
Hugging Face's row layout (``[batch * beams]`` rows at every step, finished requests included) and its
arithmetic: the processed scores and running sums in the logits' float32, ``torch.topk`` for the ranking (its tie
order), the same finished-hypothesis pool and early-stopping rule, so sequences, scores and the per-step tables
(``output_scores``, ``output_logits``, ``output_attentions``, ``output_hidden_states``, ``beam_indices``) come out
as Hugging Face's, in its layout; the tables cost nothing unless asked for.

Two things make the loop faster than Hugging Face's own, with the same results. Whisper's steps after the first
run its decoder's layers directly (:mod:`beamkit.hf.steps.direct`, the model call's logits bit for bit) where a call
asks for no per-step attentions or hidden states. And an encoder-decoder's beam reorder leaves the cross-attention
keys/values where they are when every beam of a request holds the same ones (Hugging Face copies them per beam
from one encoder output, and moves all of them at every step).

Beam search and beam sampling (:class:`BeamLoop`), greedy decoding and sampling (:class:`TokenLoop`); any other
generation mode is :class:`~beamkit.hf.Unsupported`, raised before the first forward (``beamkit.hf.patch`` then
reruns the call on Hugging Face's own method).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional
from transformers.cache_utils import EncoderDecoderCache
from transformers.modeling_outputs import Seq2SeqLMOutput

from beamkit.hf import internals
from beamkit.hf.errors import Unsupported
from beamkit.hf.loop.trie import vectorise_prefix_fns
from beamkit.hf.steps.compiled import StaticSeq2Seq, log_once, static_step
from beamkit.hf.steps.direct import FAMILIES, direct_step
from beamkit.hf.steps.paged import plain_layers
from beamkit.hf.versions import release

NEG = -1.0e9  # Hugging Face's "impossible" score, added rather than set (so rankings among them stay defined)

#: the families whose one-token steps the loop runs directly (:mod:`beamkit.hf.steps.direct`), not through the model's
#: forward, where a call asks for no per-step attentions or hidden states
DIRECT = ("whisper",)
COMPILES = ("whisper",)  # the families whose calls take compile= here (run eagerly, said once, where not DIRECT)

SORTS_DRAWS = release() >= (5, 24)  # beam sampling orders its drawn candidates by score from 5.24 on


def decode(
    model: Any,
    input_ids: torch.Tensor,
    logits_processor: Any,
    stopping_criteria: Any,
    generation_config: Any,
    synced_gpus: bool = False,
    *,
    compile_backend: str | None = None,
    judged: bool = False,
    **model_kwargs: Any,
) -> Any:
    """A decoding method for ``model.generate(custom_generate=decode)``: Hugging Face's prepared ``input_ids``
    (``[batch * beams, P]``, expanded), its processor and stopping-criteria lists and generation config, and the
    model keywords it built; returns what Hugging Face's own method for the mode returns. Raises
    :class:`~beamkit.hf.Unsupported` (before any forward) for modes other than greedy, sampling, beam search and
    beam sampling. ``compile_backend`` (a ``torch.compile`` backend; ``beamkit.hf.generate(..., compile=...)``
    passes it) runs Whisper's steps compiled over static shapes (:mod:`beamkit.hf.steps.compiled`). ``judged``:
    the caller (:func:`beamkit.hf.route`) has checked the mode already (:func:`mode_refusal`); the loop then only
    reads which one it is (Hugging Face may change it inside ``generate``: Whisper's temperature fallback samples)."""
    loop = loop_for(generation_config, judged)
    logits_processor = vectorise_prefix_fns(logits_processor)  # a beamkit.Trie's callable: applied vectorised
    run = Run(model, logits_processor, stopping_criteria, generation_config, bool(synced_gpus), model_kwargs)
    run.compile(compile_backend)
    try:
        return loop(run).decode(input_ids)
    finally:
        run.release()


def loop_for(generation_config: Any, judged: bool = False) -> type[TokenLoop] | type[BeamLoop]:
    """The loop that decodes ``generation_config``'s generation mode; :class:`~beamkit.hf.Unsupported` naming
    :func:`mode_refusal`'s reason for the modes it does not decode, unless the caller has ``judged`` the mode."""
    refusal = None if judged else mode_refusal(generation_config)
    if refusal is not None:
        raise Unsupported(refusal)
    return LOOPS[generation_config.get_generation_mode().value]


def mode_refusal(generation_config: Any) -> str | None:
    """Why the loop does not decode ``generation_config``'s generation mode (contrastive search, DoLa, assisted,
    diverse and constrained beam search; ``low_memory=True``), None when it does. Settings Hugging Face itself
    rejects (its ``get_generation_mode`` raises) are no refusal: its own ``generate`` raises its error."""
    try:
        mode = generation_config.get_generation_mode().value
    except (ValueError, TypeError):  # Hugging Face's own check: raised again when its generate runs the call
        return None
    if mode not in LOOPS:
        return f"generation mode {mode!r} is not decoded by beamkit"
    if getattr(generation_config, "low_memory", False):
        return "low_memory=True"
    return None


@dataclass
class Run:
    """What one call decodes with: the model, Hugging Face's processors / stopping criteria / config, and the
    model keywords (the cache among them), updated after every forward as Hugging Face does."""

    model: Any
    processors: Any
    stopping: Any
    config: Any
    synced_gpus: bool
    kwargs: dict[str, Any]
    direct: Any = None  # the direct step (beamkit.hf.steps.direct) this call's steps may run, None where they may not
    why: str = ""  # why not, where they may not
    static: Any = None  # the compiled static step (beamkit.hf.steps.compiled) this call's steps run, when compiling
    buffers: Any = None  # its keys/values buffers (StaticSeq2Seq), from the first step it runs to the release

    def __post_init__(self) -> None:
        name = type(self.model).__name__
        if FAMILIES.get(name) not in DIRECT:
            self.why = f"beamkit's loop runs {name}'s steps through its forward (it runs only Whisper's directly)"
        elif self.config.output_attentions or self.config.output_hidden_states:
            self.why = "per-step attentions or hidden states come from the model's forward"
        else:
            self.direct, self.why = direct_step(self.model)

    def compile(self, backend: str | None) -> None:
        """Run this call's steps through the model's compiled static step for ``backend`` (None: eagerly), where
        they run directly; elsewhere log once why they do not."""
        if backend is None:
            return
        if self.direct is None:
            log_once(f"beamkit: compile= runs eagerly for this call: {self.why}")
            return
        self.static = static_step(self.model, self.direct, backend, self.why)

    @property
    def encoder_decoder(self) -> bool:
        """Whether the model is an encoder-decoder (its tables are named ``decoder_*`` / ``cross_*``)."""
        return bool(self.model.config.is_encoder_decoder)

    def prefill(self, input_ids: torch.Tensor) -> Any:
        """The first forward over the whole prompt (Hugging Face's own prefill: chunking, embeddings, a given
        cache's offset)."""
        first = not getattr(self.config, "is_assistant", False)
        return internals.prefill(self.model, input_ids, self.config, self.kwargs, first)

    def forward(self, rows: torch.Tensor, call: Any = None) -> Any:
        """One forward of the rows' tokens so far (``[rows, L]``): only the last one with the cache, all of them
        with ``use_cache=False``."""
        if self.buffers is not None:  # the same inputs as the step that made them: the rows' last tokens
            if self.direct.usable():
                return self.static_forward(rows[:, -1:])
            self.release()  # the model changed (training mode, a global hook): back to its own cache and call
        new = 1 if self.kwargs.get("use_cache") else None
        inputs = self.model.prepare_inputs_for_generation(rows, next_sequence_length=new, **self.kwargs)
        if call is None and self.direct is not None:
            cache = direct_inputs(inputs)
            if cache is None and self.static is not None:
                log_once("beamkit: compile= runs eagerly for this call: its steps pass the model other inputs")
            if cache is not None and self.direct.usable():
                if self.static is not None:
                    # the cache's keys/values move into buffers of its rows and frames (both fixed for the call)
                    self.buffers = StaticSeq2Seq(cache, exact=True)
                    return self.static_forward(inputs["decoder_input_ids"])
                logits = self.direct(inputs["decoder_input_ids"], None, None, cache)  # shape: (rows, V)
                return step_output(logits[:, None, :], cache)
        return (call or self.model)(**inputs, return_dict=True)

    def static_forward(self, ids: torch.Tensor) -> Any:
        """One compiled static step of the tokens ``ids`` (``[rows, 1]``) over the buffers (every audio frame
        read, as Whisper's decoder reads them); the output names the model's own cache (emptied while the buffers
        hold its keys/values), which the keywords keep."""
        logits = self.static(ids, None, self.buffers)  # shape: (rows, V)
        return step_output(logits[:, None, :], self.buffers.original)

    def release(self) -> None:
        """The buffers' keys/values back into the model's own cache (what the call returns), if they hold them."""
        if self.buffers is not None:
            self.buffers.to_dynamic()
            self.buffers = None

    def absorb(self, outputs: Any) -> None:
        """Take the forward's cache, masks and positions into the model keywords (Hugging Face's update)."""
        self.kwargs = internals.update_model_kwargs(self.model, outputs, self.kwargs, self.encoder_decoder)

    def more(self, finished: bool, device: torch.device) -> bool:
        """Whether to run another step (with ``synced_gpus``, until every process is done)."""
        return internals.has_unfinished(self.model, finished, self.synced_gpus, device)

    def cache(self) -> tuple[str, Any] | None:
        """The cache keyword and its value, when the model keeps one (the installed release's cache names)."""
        for name in internals.cache_names():
            if name in self.kwargs:
                return name, self.kwargs[name]
        return None


#: the field of a model's output that holds its cache (``cache`` from transformers 5.24 on)
OUTPUT_CACHE = "cache" if "cache" in Seq2SeqLMOutput.__dataclass_fields__ else "past_key_values"


def step_output(logits: torch.Tensor, cache: Any) -> Any:
    """A directly run step's output as the model's forward returns it: the logits ``[rows, 1, V]`` and the
    cache."""
    return Seq2SeqLMOutput(logits=logits, **{OUTPUT_CACHE: cache})


def direct_inputs(inputs: dict[str, Any]) -> Any:
    """The cache of a step whose model inputs the direct step takes as they are, None for any other: one decoder
    token per row, an ``EncoderDecoderCache`` of plain layers with the cross-attention keys/values already
    cached, the encoder's output, and nothing else (no decoder mask, positions or embeddings)."""
    given = {name for name, value in inputs.items() if value is not None}
    names = [name for name in internals.cache_names() if name in given]  # the release's cache keyword
    if len(names) != 1:
        return None
    ids, cache = inputs.get("decoder_input_ids"), inputs[names[0]]
    if given - {"decoder_input_ids", names[0], "encoder_outputs", "use_cache"} or not inputs.get("use_cache"):
        return None
    if ids is None or ids.dim() != 2 or ids.shape[1] != 1 or type(cache) is not EncoderDecoderCache:
        return None
    own, cross = cache.self_attention_cache, cache.cross_attention_cache
    if not plain_layers(own) or not plain_layers(cross) or len(own.layers) != len(cross.layers):
        return None
    if not all(cache.is_updated.get(i) for i in range(len(cross.layers))):
        return None
    return cache


@dataclass
class Tables:
    """The per-step tables Hugging Face returns when asked: tuples over steps (None when not asked)."""

    scores: tuple[Any, ...] | None
    logits: tuple[Any, ...] | None
    attentions: tuple[Any, ...] | None
    cross: tuple[Any, ...] | None
    hidden: tuple[Any, ...] | None
    encoder_attentions: Any = None
    encoder_hidden: Any = None

    @classmethod
    def asked(cls, run: Run) -> Tables:
        """Empty tuples for what the call asks for (``return_dict_in_generate`` plus the ``output_*`` flags)."""
        gc = run.config

        def empty(flag: Any) -> tuple[Any, ...] | None:
            return () if gc.return_dict_in_generate and flag else None

        attentions = gc.output_attentions
        tables = cls(
            empty(gc.output_scores), empty(gc.output_logits), empty(attentions), empty(attentions),
            empty(gc.output_hidden_states),
        )  # fmt: skip
        if gc.return_dict_in_generate and run.encoder_decoder:
            enc = run.kwargs["encoder_outputs"]
            tables.encoder_attentions = enc.get("attentions") if gc.output_attentions else None
            tables.encoder_hidden = enc.get("hidden_states") if gc.output_hidden_states else None
        return tables

    def add(
        self, outputs: Any, logits: torch.Tensor, scores: torch.Tensor, encoder_decoder: bool, copy: bool = False
    ) -> None:
        """Keep this step's tables (``logits`` / ``scores`` ``[rows, V]``, copied when ``copy``, as Hugging Face's
        beam search keeps copies; the forward's attentions and hidden states, per layer)."""
        if self.logits is not None:
            self.logits += (logits.clone() if copy else logits,)
        if self.scores is not None:
            self.scores += (scores.clone() if copy else scores,)
        if self.attentions is not None:
            self.attentions += (outputs.decoder_attentions if encoder_decoder else outputs.attentions,)
            if encoder_decoder and self.cross is not None:
                self.cross += (outputs.cross_attentions,)
        if self.hidden is not None:
            self.hidden += (outputs.decoder_hidden_states if encoder_decoder else outputs.hidden_states,)

    def output(self, run: Run, kind: str, **fields: Any) -> Any:
        """Hugging Face's output object of ``kind`` (``"Generate"`` or ``"GenerateBeam"``)."""
        cache = run.cache()
        cls = internals.output_class(kind, run.encoder_decoder)
        field = "cache" if "cache" in cls.__dataclass_fields__ else "past_key_values"  # renamed in 5.24
        common = {"scores": self.scores, "logits": self.logits, field: cache[1] if cache else None}
        if run.encoder_decoder:
            return cls(
                **fields, **common, encoder_attentions=self.encoder_attentions,
                encoder_hidden_states=self.encoder_hidden, decoder_attentions=self.attentions,
                cross_attentions=self.cross, decoder_hidden_states=self.hidden,
            )  # fmt: skip
        return cls(**fields, **common, attentions=self.attentions, hidden_states=self.hidden)


class TokenLoop:
    """Greedy decoding and sampling: one token per row and step (the argmax of the processed scores, or a draw
    from their softmax with torch's global generator, as Hugging Face draws)."""

    def __init__(self, run: Run):
        self.run = run

    def decode(self, input_ids: torch.Tensor) -> Any:
        """Decode ``input_ids`` (``[batch, P]``) to Hugging Face's return value."""
        run, gc, model = self.run, self.run.config, self.run.model
        pad = internals.pad_token_tensor(gc)
        if pad is not None:
            pad = pad.to(input_ids.device)
        pads_finished = any(hasattr(c, "eos_token_id") for c in run.stopping)
        tables = Tables.asked(run)
        live = torch.ones(input_ids.shape[0], dtype=torch.long, device=input_ids.device)  # shape: (B,)
        compiled = internals.auto_compiles(model, run.kwargs, gc)
        call = model.get_compiled_call(gc.compile_config) if compiled else None
        outputs, finished = run.prefill(input_ids), False
        with internals.optimized_for_decode(model):
            while run.more(finished, input_ids.device):
                if outputs is None:
                    outputs = run.forward(input_ids, call)
                run.absorb(outputs)
                if run.synced_gpus and finished:
                    outputs = None
                    continue
                logits = outputs.logits[:, -1].to(copy=True, dtype=torch.float32, device=input_ids.device)
                scores = run.processors(input_ids, logits)  # shape: (B, V)
                tables.add(outputs, logits, scores, run.encoder_decoder)
                outputs = None
                if gc.do_sample:
                    tokens = torch.multinomial(functional.softmax(scores, dim=-1), num_samples=1).squeeze(1)
                else:
                    tokens = torch.argmax(scores, dim=-1)
                if pads_finished:  # finished rows get the pad id
                    tokens = tokens * live + pad * (1 - live)
                input_ids = torch.cat([input_ids, tokens[:, None]], dim=-1)
                live = live & ~run.stopping(input_ids, tables.scores)
                finished = bool(live.max() == 0)
        if not gc.return_dict_in_generate:
            return input_ids
        return tables.output(run, "Generate", sequences=input_ids)


@dataclass
class Beams:
    """Every request's running beams and finished pool, Hugging Face's layout (``B`` requests, ``K`` beams,
    ``T`` the total length, ``N`` the new tokens): running and finished sequences ``[B, K, T]``, their
    log-probability sums / final scores ``[B, K]`` (float32), the row each step came from ``[B, K, N]`` (flat
    ``[B * K]`` row ids, -1 before the token exists), which finished slots hold a hypothesis, and whether a
    request can still improve (``[B, 1]``)."""

    running: torch.Tensor  # shape: (B, K, T) int64
    running_lp: torch.Tensor  # shape: (B, K) float32
    running_from: torch.Tensor  # shape: (B, K, N) int32
    done: torch.Tensor  # shape: (B, K, T) int64
    done_score: torch.Tensor  # shape: (B, K) float32
    done_from: torch.Tensor  # shape: (B, K, N) int32
    done_set: torch.Tensor  # shape: (B, K) bool
    improvable: torch.Tensor  # shape: (B, 1) bool

    @classmethod
    def start(cls, input_ids: torch.Tensor, beams: int, total: int, fill: int) -> Beams:
        """The prompts' beams: beam 0 live (sum 0), the others at ``NEG`` so the first step expands beam 0 only."""
        rows, width = input_ids.shape
        batch, dev = rows // beams, input_ids.device
        running = torch.full((batch, beams, total), fill, dtype=torch.int64, device=dev)
        running[:, :, :width] = input_ids.view(batch, beams, width)
        lp = torch.zeros((batch, beams), dtype=torch.float, device=dev)
        lp[:, 1:] = NEG
        came = torch.full((batch, beams, total - width), -1, dtype=torch.int32, device=dev)
        return cls(
            running, lp, came, running.clone(), torch.full((batch, beams), NEG, dtype=torch.float, device=dev),
            came.clone(), torch.zeros((batch, beams), dtype=torch.bool, device=dev),
            torch.ones((batch, 1), dtype=torch.bool, device=dev),
        )  # fmt: skip


@dataclass
class Continuations:
    """This step's ``C`` best continuations per request (``C`` = beams x max(2, 1 + eos ids)): summed
    log-probabilities ``[B, C]``, sequences with the new token ``[B, C, T]``, origins ``[B, C, N]``, and whether
    each hits a stopping criterion ``[B, C]``."""

    lp: torch.Tensor  # shape: (B, C) float32
    seqs: torch.Tensor  # shape: (B, C, T)
    came: torch.Tensor  # shape: (B, C, N)
    stops: torch.Tensor  # shape: (B, C) bool


def _pick(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[b, index[b, j], ...]`` for each request ``b`` (``table`` ``[B, K, ...]``, ``index`` ``[B, J]``)."""
    while index.dim() < table.dim():
        index = index.unsqueeze(-1)
    return torch.take_along_dim(table, index, dim=1)


class BeamLoop:
    """Beam search and beam sampling, step by step: expand (``C`` candidates per request from ``K x V``), keep
    the ``K`` best that do not stop as the running beams, merge the stopping ones among the first ``K`` into the
    finished pool (scored by length penalty), reorder the cache, and stop when no request can improve."""

    def __init__(self, run: Run):
        gc = run.config
        self.run = run
        self.k = int(gc.num_beams)
        eos = internals.eos_token_tensor(gc)
        self.c = max(2, 1 + (eos.shape[0] if eos is not None else 0)) * self.k
        pad = internals.pad_token_tensor(gc)
        self.fill = (pad or eos[0]) if eos is not None else -1  # Hugging Face's fill value, precedence included
        self.alpha = gc.length_penalty
        self.early = gc.early_stopping
        self.shared_cross: bool | None = None  # whether the beams of a request share their cross keys/values

    def decode(self, input_ids: torch.Tensor) -> Any:
        """Decode ``input_ids`` (``[batch * beams, P]``, each prompt repeated per beam) to Hugging Face's return
        value."""
        run, gc = self.run, self.run.config
        self.prompt = cur = input_ids.shape[1]
        self.batch = input_ids.shape[0] // self.k
        top_k = torch.zeros(self.c, dtype=torch.bool, device=input_ids.device)  # shape: (C,)
        top_k[: self.k] = True
        beams = Beams.start(input_ids, self.k, gc.max_length, self.fill)
        stops = torch.zeros((self.batch, self.k), dtype=torch.bool, device=input_ids.device)
        tables = Tables.asked(run)
        rows, outputs, finished = input_ids, run.prefill(input_ids), False
        while run.more(finished, input_ids.device):
            if outputs is None:
                rows = beams.running[:, :, :cur].reshape(self.batch * self.k, cur)  # shape: (B*K, cur)
                outputs = run.forward(rows)
            run.absorb(outputs)
            if run.synced_gpus and finished:
                outputs = None
                continue
            logits = outputs.logits[:, -1, :].to(copy=True, dtype=torch.float32, device=input_ids.device)
            scores = run.processors(rows, functional.log_softmax(logits, dim=-1))  # shape: (B*K, V)
            tables.add(outputs, logits, scores, run.encoder_decoder, copy=True)
            outputs = None
            cand = self.expand(beams, scores, cur, tables.scores)
            stops = cand.stops
            self.keep_running(beams, cand)
            self.finish(beams, cand, cur, top_k)
            self.reorder_cache(beams, cur)
            cur += 1
            self.update_improvable(beams, cur, gc.max_length)
            finished = not self.any_left(beams, stops)
        return self.result(beams, tables, gc)

    def expand(self, beams: Beams, scores: torch.Tensor, cur: int, tables_scores: Any) -> Continuations:
        """The ``C`` best (or, sampling, ``C`` drawn) continuations per request of the running sums plus this
        step's processed scores, with their sequences and origins, and whether each stops."""
        b, k = self.batch, self.k
        total = (scores.view(b, k, -1) + beams.running_lp[:, :, None]).reshape(b, -1)  # shape: (B, K*V) float32
        if self.run.config.do_sample:
            idx = torch.multinomial(functional.softmax(total, dim=-1), num_samples=self.c)
            lp = torch.gather(total, 1, idx)
            if SORTS_DRAWS:  # transformers 5.24 on ranks the draws, best first
                lp, order = lp.sort(dim=-1, descending=True)
                idx = idx.gather(dim=-1, index=order)
        else:
            lp, idx = torch.topk(total, k=self.c)  # shape: (B, C)
        vocab = total.shape[-1] // k
        beam, token = idx // vocab, idx % vocab
        came = _pick(beams.running_from, beam)
        seqs = _pick(beams.running, beam)
        seqs[:, :, cur] = token
        offset = torch.arange(b, device=token.device).view(-1, 1) * k
        came[:, :, cur - self.prompt] = beam + offset
        hits = self.run.stopping(seqs[:, :, : cur + 1].reshape(b * self.c, cur + 1), tables_scores)
        return Continuations(lp, seqs, came, hits.view(b, self.c))

    def keep_running(self, beams: Beams, cand: Continuations) -> None:
        """The ``K`` best candidates that do not stop become the running beams."""
        alive = cand.lp + cand.stops.to(torch.float32) * NEG
        best = torch.topk(alive, k=self.k)[1]  # shape: (B, K)
        beams.running, beams.running_lp, beams.running_from = (
            _pick(cand.seqs, best), _pick(alive, best), _pick(cand.came, best),
        )  # fmt: skip

    def finish(self, beams: Beams, cand: Continuations, cur: int, top_k: torch.Tensor) -> None:
        """Stopping candidates among each request's first ``K`` join its finished pool when they beat its
        members (none once a request is full with ``early_stopping=True`` or cannot improve)."""
        new = cand.stops & top_k[None, :]
        score = cand.lp / ((cur + 1 - self.prompt) ** self.alpha)
        full = torch.all(beams.done_set, dim=-1, keepdim=True) & (self.early is True)
        score += full.to(torch.float32) * NEG
        score += (~beams.improvable).to(torch.float32) * NEG
        score += (~new) * NEG
        merged = torch.cat((beams.done_score, score), dim=1)
        best = torch.topk(merged, k=self.k)[1]
        beams.done = _pick(torch.cat((beams.done, cand.seqs), dim=1), best)
        beams.done_score = _pick(merged, best)
        beams.done_from = _pick(torch.cat((beams.done_from, cand.came), dim=1), best)
        beams.done_set = _pick(torch.cat((beams.done_set, new), dim=1), best)

    def reorder_cache(self, beams: Beams, cur: int) -> None:
        """Gather the cache's rows to the running beams' origins (the model's own reorder where it has one)."""
        held = self.run.cache()
        if held is None:
            return
        name, cache = held
        order = beams.running_from[..., cur - self.prompt].reshape(-1)  # shape: (B*K,)
        model = self.run.model
        own = internals.reorder_cache(model)
        buffers = self.run.buffers
        if buffers is not None:  # compiled steps: the first reorder (on the model's cache) checked the cross
            buffers.self_attention_cache.reorder_cache(order)
            if not self.shared_cross:
                buffers.cross_attention_cache.reorder_cache(order)
        elif own is not None:
            self.run.kwargs[name] = own(cache, order)
        elif self.beams_share_cross(cache):  # its rows move within their request: only the self-attention's
            cache.self_attention_cache.reorder_cache(order)
        elif hasattr(cache, "reorder_cache"):
            cache.reorder_cache(order)
        else:
            raise ValueError(f"{type(model).__name__} cannot use beam search with a cache: it cannot be reordered")

    def beams_share_cross(self, cache: Any) -> bool:
        """Whether ``cache`` is an ``EncoderDecoderCache`` whose cross-attention keys/values are the same for
        every beam of a request (Hugging Face expands the encoder's output per beam), so that reordering rows
        within each request leaves them as they are: checked once per call, at the first reorder (the cross
        cache is written at the prefill only)."""
        if type(cache) is not EncoderDecoderCache:
            return False
        if self.shared_cross is None:
            cross: Any = cache.cross_attention_cache
            b, k = self.batch, self.k
            same = (  # read only for plain layers, and only until one differs
                torch.equal(t.reshape(b, k, -1), t[::k].reshape(b, 1, -1).expand(-1, k, -1))  # shape: (B, K, rest)
                for layer in cross.layers
                for t in (layer.keys, layer.values)
            )
            self.shared_cross = plain_layers(cross) and all(same)
        return self.shared_cross

    def update_improvable(self, beams: Beams, cur: int, max_length: int) -> None:
        """A request stays open while its best running beam could still beat its worst finished one (Hugging
        Face's estimate: at the current length, or at ``max_length`` with ``early_stopping="never"`` and a
        positive length penalty)."""
        longest = self.early == "never" and self.alpha > 0.0
        length = (max_length if longest else cur) - self.prompt
        best = beams.running_lp[:, :1] / (length**self.alpha)
        worst = torch.where(beams.done_set, torch.min(beams.done_score, dim=1, keepdim=True)[0], NEG)
        beams.improvable = beams.improvable & torch.any(best > worst, dim=-1, keepdim=True)

    def any_left(self, beams: Beams, stops: torch.Tensor) -> bool:
        """Whether another step may change a result."""
        improvable = torch.any(beams.improvable)
        open_beam = ~(torch.all(beams.done_set) & (self.early is True))
        continuing = ~torch.all(stops)
        return bool(improvable & open_beam & continuing)

    def result(self, beams: Beams, tables: Tables, gc: Any) -> Any:
        """The first ``num_return_sequences`` finished hypotheses per request, cut to the longest one."""
        n, b = int(gc.num_return_sequences), self.batch
        seqs = beams.done[:, :n].reshape(b * n, -1)
        scores = beams.done_score[:, :n].reshape(-1)
        came = beams.done_from[:, :n].reshape(b * n, -1)
        longest = (came + 1).bool().sum(dim=1).max()
        seqs, came = seqs[:, : self.prompt + longest], came[:, :longest]
        if not gc.return_dict_in_generate:
            return seqs
        return tables.output(
            self.run, "GenerateBeam", sequences=seqs, sequences_scores=scores if gc.output_scores else None,
            beam_indices=came,
        )  # fmt: skip


LOOPS: dict[str, type[TokenLoop] | type[BeamLoop]] = {
    "greedy_search": TokenLoop,
    "sample": TokenLoop,
    "beam_search": BeamLoop,
    "beam_sample": BeamLoop,
}
