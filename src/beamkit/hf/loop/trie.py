"""A :class:`beamkit.Trie`'s ``prefix_allowed_tokens_fn`` inside Hugging Face's ``generate``: the processor list's
``PrefixConstrainedLogitsProcessor`` over it replaced by one that walks all rows down the trie at once."""

from __future__ import annotations

from typing import Any

import numpy as np

from beamkit.constraints import ROOT, PrefixFn, allowed_pairs, check_vocab
from beamkit.hf.internals import prefix_constraint


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
