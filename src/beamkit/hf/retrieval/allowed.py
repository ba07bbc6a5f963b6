"""The output layer over a dictionary's allowed ids (``beamkit.hf.generate(..., allowed_output=...)``).

With a :class:`beamkit.Trie`'s ``prefix_allowed_tokens_fn`` every row may only take the ids its trie node
allows. :class:`AllowedOutputStep` wraps the bridge's step function and follows each row's trie node itself (in
the state, gathered by parent like the key/value cache), so that before the model runs it knows the *union*:
the ids some row may take this step. Two normalisations:

* ``"allowed"``: the output layer (``lm_head``) is computed only for the union's columns
  (``[rows, H] @ [H, |union|]`` instead of ``[H, V]``), and each row's log-probabilities are normalised over
  the ids *that row* may take (a distribution over the dictionary's continuations). Scores and rankings change
  against Hugging Face's (see the generative retrieval guide's figures).
* ``"vocab"``: Hugging Face's semantics, normalised over the whole vocabulary, so the scores equal
  ``model.generate``'s. The normaliser (log-sum-exp over V) needs every logit, so the full output layer is
  still computed; what the step hands the search is the union's log-probabilities, the rest ``-inf``.

Either way the step returns ``[rows, V]`` scores (``-inf`` off the allowed ids) with ``extras={"log_softmax":
False}``: they are already log-probabilities. Decoder-only models whose logits are ``lm_head(hidden)`` exactly;
a model that transforms the logits after its ``lm_head`` (a final bias, soft-capping, a logit scale) is refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from beamkit._checks import check_choice
from beamkit.constraints import FRESH, ROOT, Trie, allowed_pairs
from beamkit.hf.errors import Unsupported
from beamkit.hf.steps.step import output_head
from beamkit.state import concat_state, select_state

NORMALISATIONS = ("vocab", "allowed")

#: config fields of models whose logits are not ``lm_head(hidden)`` (value: the setting that leaves them so)
_AFTER_HEAD = {"final_logit_softcapping": None, "logit_scale": None, "logits_scaling": 1.0}


class AllowedRows:
    """The wrapped step's state plus each row's trie node ``[rows]`` (:data:`beamkit.constraints.FRESH` for a
    row that has not run yet), gathered and joined together."""

    def __init__(self, inner: Any, node: np.ndarray):
        self.inner = inner
        self.node = node  # shape: (rows,) int64

    def beamkit_select(self, idx: np.ndarray) -> AllowedRows:
        """The rows ``idx`` (parents) of both."""
        return AllowedRows(select_state(self.inner, idx), self.node[np.asarray(idx, np.int64)])

    def beamkit_concat(self, others: list[Any]) -> AllowedRows:
        """These rows, then the others' (requests joining)."""
        return AllowedRows(
            concat_state([self.inner, *[o.inner for o in others]]),
            np.concatenate([self.node, *[o.node for o in others]]),
        )

    def kv_bytes(self) -> int:
        """The wrapped state's key/value bytes (0 when it does not count them)."""
        count = getattr(self.inner, "kv_bytes", None)
        return int(count()) if callable(count) else 0


class _Columns(torch.nn.Module):
    """``lm_head`` restricted to some columns: ``hidden @ weight[cols].T (+ bias[cols])``."""

    def __init__(self, head: torch.nn.Linear, cols: torch.Tensor):
        super().__init__()
        self.weight = head.weight.index_select(0, cols)  # shape: (|cols|, H)
        self.bias = None if head.bias is None else head.bias.index_select(0, cols)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(hidden, self.weight, self.bias)  # shape: (..., |cols|)


def check_head(model: Any) -> None:
    """:class:`Unsupported` unless the model's logits are ``model.lm_head(hidden)``, a ``torch.nn.Linear``,
    with nothing applied after it."""
    head = getattr(model, "lm_head", None)
    if not isinstance(head, torch.nn.Linear):
        raise Unsupported(f"allowed_output: {type(model).__name__} has no lm_head Linear layer to restrict")
    if getattr(model, "final_logits_bias", None) is not None:
        raise Unsupported(f"allowed_output: {type(model).__name__} adds a bias after its lm_head")
    cfg = model.config
    for name, plain in _AFTER_HEAD.items():
        if getattr(cfg, name, plain) != plain:
            raise Unsupported(f"allowed_output: {type(model).__name__} transforms its logits ({name})")


class AllowedOutputStep:
    """A decoder-only step function (:class:`beamkit.hf.DecoderOnlyStep`) whose output layer covers only the
    ids ``trie`` allows some row this step; ``normalise``: ``"vocab"`` or ``"allowed"`` (see the module
    docstring). ``eos``: the stop tokens allowed where a dictionary entry ends."""

    def __init__(self, step: Any, model: Any, trie: Trie, eos: tuple[int, ...], normalise: str = "vocab"):
        check_choice("allowed_output", normalise, NORMALISATIONS)
        check_head(model)
        self.step, self.model, self.trie, self.normalise = step, model, trie, normalise
        vocab = int(model.lm_head.weight.shape[0])
        self.eos = tuple(e for e in eos if 0 <= e < vocab)
        self.union_sizes: list[int] = []  # ids in the union, per call (benchmarks read it)

    @property
    def stats(self) -> Any:
        """The wrapped step's counts."""
        return self.step.stats

    @property
    def forward_seconds(self) -> float:
        """Time spent inside the model forward."""
        return float(self.step.forward_seconds)

    def init_state(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> AllowedRows:
        """The wrapped step's initial state, every row before the dictionary's root."""
        inner = self.step.init_state(input_ids, attention_mask)
        return AllowedRows(inner, np.full(int(input_ids.shape[0]), FRESH, np.int64))

    def __call__(self, state: AllowedRows, y_prev: Any) -> tuple[torch.Tensor, AllowedRows, dict[str, Any]]:
        """One step: the rows' nodes advanced by their last tokens, the model run, ``[rows, V]`` log-probabilities
        on the allowed ids (``-inf`` elsewhere)."""
        tokens = np.asarray(torch.as_tensor(y_prev).cpu(), np.int64).reshape(-1)  # shape: (rows,)
        node = np.where(state.node == FRESH, ROOT, self.trie.child(state.node, tokens))  # shape: (rows,)
        rows, cols = allowed_pairs(self.trie, node, self.eos)  # shape: (pairs,), (pairs,)
        if self.normalise == "vocab":
            logits, inner = self.step(state.inner, y_prev)  # shape: (rows, V)
            lse = torch.logsumexp(logits, dim=-1)  # shape: (rows,) over the whole vocabulary
            r = torch.as_tensor(rows, device=logits.device)
            c = torch.as_tensor(cols, device=logits.device)
            self.union_sizes.append(int(np.unique(cols).size))
            out = torch.full_like(logits, -torch.inf)
            out[r, c] = logits[r, c] - lse[r]
            return out, AllowedRows(inner, node), {"log_softmax": False}
        union = np.unique(cols)  # shape: (U,) ascending
        self.union_sizes.append(int(union.size))
        device = self.model.lm_head.weight.device
        u = torch.as_tensor(union, device=device)
        with output_head(_Columns(self.model.lm_head, u)):  # the model's own lm_head is not replaced
            part, inner = self.step(state.inner, y_prev)  # shape: (rows, U)
        r = torch.as_tensor(rows, device=part.device)
        at = torch.as_tensor(np.searchsorted(union, cols), device=part.device)  # shape: (pairs,) columns of part
        kept = torch.full_like(part, -torch.inf)
        kept[r, at] = part[r, at]
        lse = torch.logsumexp(kept, dim=-1, keepdim=True)  # shape: (rows, 1) over each row's allowed ids
        logp = torch.where(torch.isfinite(lse), kept - lse, kept)  # a row with nothing allowed stays -inf
        vocab = int(self.model.lm_head.weight.shape[0])
        out = part.new_full((part.shape[0], vocab), -torch.inf)
        out[:, u] = logp  # shape: (rows, V)
        return out, AllowedRows(inner, node), {"log_softmax": False}
