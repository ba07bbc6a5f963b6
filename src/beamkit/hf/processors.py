"""Hugging Face's logit processors as beamkit processors: the settings -> processors map, and the forced-token
processor the core set does not cover."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from beamkit import ops
from beamkit.constraints import ROOT, PrefixFn, TrieMask, allowed_pairs, check_vocab
from beamkit.hf.internals import prefix_constraint
from beamkit.hf.settings import Settings
from beamkit.processors import (
    BadWords,
    NoRepeatNGram,
    RepetitionPenalty,
    SequenceBias,
    StepContext,
    SuppressTokens,
    Temperature,
)


@dataclass(frozen=True)
class ForcedTokens:
    """At generated step ``step``, allow only ``tokens``, each with log-probability 0 (everything else ``-inf``).

    This is what Hugging Face's ``ForcedBOSTokenLogitsProcessor`` / ``ForcedEOSTokenLogitsProcessor`` do to the
    log-probabilities: the forced token's own score is replaced by 0, not kept.
    """

    step: int
    tokens: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.tokens:
            raise ValueError("ForcedTokens needs at least one token id")

    def __call__(self, scores: Any, ctx: StepContext) -> Any:
        if ctx.step != self.step:
            return scores
        cols = np.asarray(self.tokens, dtype=np.int64)
        if ops.is_torch(scores):
            import torch

            scores[:] = float("-inf")
            scores[:, torch.as_tensor(cols, device=scores.device)] = 0.0
            return scores
        scores[:] = -np.inf
        scores[:, cols] = 0.0
        return scores


def build_processors(settings: Settings, prompts: tuple[tuple[int, ...], ...], first: list[int]) -> list[Any]:
    """beamkit processors reproducing Hugging Face's, in Hugging Face's order.

    ``prompts`` are the token rows Hugging Face's processors see before the first new token (the left-padded
    prompt for decoder-only models, the start token for encoder-decoder models); ``first[r]`` is the first
    attended column of prompt ``r`` (the repetition penalty skips the left padding before it). The search
    options' own ``processors`` go after these.
    """
    s = settings
    procs: list[Any] = []
    if s.sequence_bias is not None:  # first, as in Hugging Face (the repetition penalty then scales biased scores)
        procs.append(SequenceBias(s.sequence_bias, prompts))
    if s.repetition_penalty != 1.0:
        seen = prompts if s.encoder_decoder else tuple(p[f:] for p, f in zip(prompts, first, strict=True))
        procs.append(RepetitionPenalty(s.repetition_penalty, seen))
    if s.no_repeat_ngram > 0:
        procs.append(NoRepeatNGram(s.no_repeat_ngram, prompts))
    banned = tuple(w for w in s.bad_words if not (len(w) == 1 and w[0] in s.eos))  # Hugging Face never bans eos
    if banned:
        procs.append(BadWords(banned, prompts))
    if s.prefix_fn is not None:  # Hugging Face's prefix_allowed_tokens_fn, vectorised (a beamkit.Trie's)
        procs.append(TrieMask(s.prefix_fn.trie, s.prefix_fn.eos))
    if s.forced_bos is not None and s.prompt_len == 1:
        procs.append(ForcedTokens(0, (s.forced_bos,)))
    if s.forced_eos is not None:
        procs.append(ForcedTokens(s.max_new_tokens - 1, s.forced_eos))
    if s.suppress is not None:
        procs.append(SuppressTokens(s.suppress))
    if s.begin_suppress is not None:  # Hugging Face's begin index: one step later after a forced first token
        later = s.prompt_len == 1 and s.forced_bos is not None
        procs.append(SuppressTokens(s.begin_suppress, at_step=1 if later else 0))
    if s.do_sample:  # Hugging Face's warpers, last; beam sampling keeps at least one token besides eos
        keep = 2 if s.num_beams > 1 else 1
        if s.temperature != 1.0:
            procs.append(Temperature(s.temperature))
        if s.top_k:
            procs.append(TopKMask(max(s.top_k, keep)))
        if s.top_p < 1.0:
            procs.append(TopPMask(s.top_p, keep))
    return procs


@dataclass(frozen=True)
class TopKMask:
    """Hugging Face's ``TopKLogitsWarper``: every score below the row's ``k``-th largest becomes ``-inf``
    (torch scores, as the bridge's)."""

    k: int

    def __call__(self, scores: Any, ctx: StepContext) -> Any:
        k = min(self.k, int(scores.shape[-1]))
        kth = scores.topk(k, dim=-1).values[..., -1:]  # shape: (rows, 1)
        return scores.masked_fill(scores < kth, float("-inf"))


@dataclass(frozen=True)
class TopPMask:
    """Hugging Face's ``TopPLogitsWarper``: the smallest-probability tokens whose total is at most ``1 - p``
    become ``-inf``, keeping at least ``keep`` tokens (torch scores)."""

    p: float
    keep: int = 1

    def __call__(self, scores: Any, ctx: StepContext) -> Any:
        ranked, order = scores.sort(dim=-1, descending=False)  # shape: (rows, V) ascending
        cumulative = ranked.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= 1 - self.p
        drop[..., -self.keep :] = False
        return scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))


class TrieLogitsProcessor:
    """Hugging Face's ``PrefixConstrainedLogitsProcessor`` for a :class:`beamkit.Trie`'s callable, vectorised:
    the rows' new tokens walked down the trie at once (one small host copy of ``[rows, t]`` ids per step), the
    allowed ids set in one scatter. Same result as Hugging Face's row-by-row calls: the mask added to the
    scores, an empty allowed list raises, a request whose allowed ids are all ``-inf`` gets the bare mask."""

    def __init__(self, fn: PrefixFn, num_beams: int):
        self.fn = fn
        self.num_beams = num_beams
        self.prefix: int | None = None  # the decoder's prefix width, seen at the first step

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        fn = self.fn
        check_vocab(fn.trie, int(scores.shape[-1]), "the prefix_allowed_tokens_fn's dictionary")
        if self.prefix is None:  # the first step sees the decoder's prefix alone
            self.prefix = int(input_ids.shape[1])
        tokens = input_ids[:, fn.prompt_len :].cpu().numpy()  # shape: (rows, t)
        node = fn.trie.walk(tokens)  # shape: (rows,)
        dead = node < 0
        if not fn.eos:  # a row off the dictionary gets the root's children (PrefixFn's answer)
            node = np.where(dead, ROOT, node)
        rows, cols = allowed_pairs(fn.trie, node, fn.eos)
        if fn.eos and dead.any():  # ... or the stop tokens
            where = np.flatnonzero(dead)
            stop = np.asarray(fn.eos, np.int64)
            rows = np.concatenate([rows, np.repeat(where, stop.size)])
            cols = np.concatenate([cols, np.tile(stop, where.size)])
        empty = np.bincount(rows, minlength=node.shape[0]) == 0
        if empty.any():  # a row at the end of an entry, with no stop token to take (as Hugging Face, raise)
            row = int(np.flatnonzero(empty)[0])
            said = f"`prefix_allowed_tokens_fn` returned an empty list for batch ID {row // self.num_beams}: "
            if self.prefix != fn.prompt_len:
                raise ValueError(
                    f"{said}it was made with prompt_len={fn.prompt_len} but the decoder's prefix is {self.prefix} "
                    "tokens wide (the padded prompt, or the start tokens of an encoder-decoder model), so it reads "
                    f"the wrong tokens: make it with trie.prefix_allowed_tokens_fn(prompt_len={self.prefix})"
                )
            raise ValueError(
                f"{said}beam {row % self.num_beams} holds a whole entry of the dictionary ({tokens[row].tolist()}) "
                "and nothing may follow it. Hugging Face keeps such beams running when the dictionary allows fewer "
                f"continuations than num_beams={self.num_beams} ({len(fn.trie)} entries in all): pass eos_token_id= "
                "to trie.prefix_allowed_tokens_fn (the stop tokens are then allowed after an entry), or fewer beams"
            )
        mask = torch.full_like(scores, float("-inf"))
        mask[torch.as_tensor(rows, device=scores.device), torch.as_tensor(cols, device=scores.device)] = 0
        processed = scores + mask
        batch = scores.shape[0] // self.num_beams
        unsatisfiable = processed.amax(dim=-1).isneginf().view(batch, -1).all(dim=-1, keepdim=True)
        return torch.where(unsatisfiable.repeat_interleave(self.num_beams, dim=0), mask, processed)


def vectorise_prefix_fns(processors: Any) -> Any:
    """Hugging Face's processor list with each ``PrefixConstrainedLogitsProcessor`` over a :class:`beamkit.Trie`'s
    callable replaced by a :class:`TrieLogitsProcessor` (in place, same position); others untouched."""
    for i, proc in enumerate(processors):
        held = prefix_constraint(proc)
        if held is not None and isinstance(held[0], PrefixFn):
            processors[i] = TrieLogitsProcessor(held[0], held[1])
    return processors
