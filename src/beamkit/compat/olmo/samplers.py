"""Samplers (OLMo's ``Sampler`` protocol): how each step's candidates are picked.

``init_state(start_class_log_probabilities [batch, V], batch_size, num_classes)`` returns the sampler's state;
``sample_nodes(log_probs [rows, V], per_node_beam_size, state)`` picks each hypothesis's candidate tokens and
``sample_beams(log_probs [batch, k], beam_size, state)`` picks the beams among a batch element's candidates; both
return ``(log_probs [n, m], indices [n, m], state)``. The default ``sample_beams`` keeps the ``beam_size`` best.

The built-in samplers are beamkit's own selectors (:class:`beamkit.TopK`, :class:`beamkit.TopP`,
:class:`beamkit.Multinomial`) with OLMo's parameters, drawing from torch's default generator (so
``torch.manual_seed`` makes a search repeatable); called directly, they return torch tensors as OLMo's do.
``temperature`` changes only the distribution a sampler draws from: the log-probabilities a search adds up are
the step's own. :class:`GumbelSampler` is Kool et al.'s stochastic beam search, with OLMo's state (``phi_S``, the
running log-probabilities, and ``G_phi_S``, their perturbed values).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from beamkit import ops
from beamkit._checks import check_bool, check_float, check_int
from beamkit.processors import StepContext
from beamkit.samplers import Multinomial, RowSampler, TopK, TopP

StateType = dict[str, Any]


class Sampler:
    """The protocol (see the module docstring); subclasses implement ``sample_nodes`` at least."""

    def init_state(self, start_class_log_probabilities: Any, batch_size: int, num_classes: int) -> StateType:
        """The state before the first step: empty by default."""
        return {}

    def sample_nodes(self, log_probs: Any, per_node_beam_size: int, state: StateType) -> tuple[Any, Any, StateType]:
        """Each row's ``per_node_beam_size`` candidate tokens (subclasses implement it)."""
        raise NotImplementedError

    def sample_beams(self, log_probs: Any, beam_size: int, state: StateType) -> tuple[Any, Any, StateType]:
        """The ``beam_size`` most likely of each row (ties to the lower index), best first."""
        return (*top_k(log_probs, beam_size), {})


class DeterministicSampler(Sampler):
    """The most likely nodes and beams (ties to the lower token id)."""

    def sample_nodes(self, log_probs: Any, per_node_beam_size: int, state: StateType) -> tuple[Any, Any, StateType]:
        """The ``per_node_beam_size`` most likely tokens of each row, best first."""
        return (*top_k(log_probs, per_node_beam_size), {})


class _Drawing(Sampler):
    """A sampler that is one of beamkit's row selectors (``self.selector``), drawing from torch's default
    generator."""

    selector: RowSampler

    def check(self, per_node_beam_size: int, num_classes: int) -> None:
        """Raise ValueError when the sampler cannot give ``per_node_beam_size`` candidates of ``num_classes``."""

    def sample_nodes(self, log_probs: Any, per_node_beam_size: int, state: StateType) -> tuple[Any, Any, StateType]:
        """``per_node_beam_size`` tokens drawn for each row of ``log_probs`` ``[rows, V]``."""
        import torch

        self.check(per_node_beam_size, int(log_probs.shape[1]))
        rows = int(log_probs.shape[0])
        ctx = StepContext(step=1, tokens=np.zeros((rows, 0), np.int64), request=np.arange(rows), eos=())
        zeros = np.zeros(rows)
        _, tok, _ = self.selector.candidates(log_probs, zeros, zeros, per_node_beam_size, ctx)
        indices = torch.as_tensor(tok, device=log_probs.device)  # shape: (rows, per_node_beam_size)
        return log_probs.gather(1, indices), indices, state


def _generator() -> Any:
    import torch

    return torch.default_generator


class MultinomialSampler(_Drawing):
    """Each row draws its tokens from softmax(log_probs / temperature), with or without replacement."""

    def __init__(self, temperature: float = 1.0, with_replacement: bool = False) -> None:
        self.temperature = temperature
        self.with_replacement = with_replacement
        self.selector = Multinomial(
            generator=_generator(),
            temperature=check_float("temperature", temperature, above=0),
            with_replacement=check_bool("with_replacement", with_replacement),
        )


class TopKSampler(_Drawing):
    """Each row draws from its ``k`` most likely tokens, renormalised (after the temperature); beams are the
    most likely. ``k`` must be at least ``per_node_beam_size`` and at most the vocabulary."""

    def __init__(self, k: int = 1, temperature: float = 1.0, with_replacement: bool = False) -> None:
        self.k = check_int("k", k, 1)
        self.temperature = temperature or 1.0  # 0 means the default, as in OLMo
        self.with_replacement = with_replacement
        self.selector = TopK(
            k=self.k,
            generator=_generator(),
            temperature=check_float("temperature", self.temperature, above=0),
            with_replacement=check_bool("with_replacement", with_replacement),
        )

    def check(self, per_node_beam_size: int, num_classes: int) -> None:
        """``per_node_beam_size <= k <= num_classes``, else ValueError."""
        if not per_node_beam_size <= self.k <= num_classes:
            raise ValueError(
                f"TopKSampler k={self.k} must be at least per_node_beam_size ({per_node_beam_size}) and at most "
                f"the vocabulary size ({num_classes})"
            )


class TopPSampler(_Drawing):
    """Nucleus sampling: each row draws from the most likely tokens whose probability (after the temperature)
    first reaches ``p``, renormalised; without replacement the nucleus holds at least ``per_node_beam_size``
    tokens. ``p`` is between 0 and 1 (0: the most likely token alone)."""

    def __init__(self, p: float = 0.9, temperature: float = 1.0, with_replacement: bool = False) -> None:
        self.p = check_float("p", p, least=0.0, most=1.0)
        self.temperature = temperature or 1.0  # 0 means the default, as in OLMo
        self.with_replacement = with_replacement
        self.selector = TopP(
            p=self.p or _SMALLEST_P,
            generator=_generator(),
            temperature=check_float("temperature", self.temperature, above=0),
            with_replacement=check_bool("with_replacement", with_replacement),
            widen=True,
        )

    def check(self, per_node_beam_size: int, num_classes: int) -> None:
        """``per_node_beam_size <= num_classes``, else ValueError."""
        if per_node_beam_size > num_classes:
            raise ValueError(
                f"per_node_beam_size ({per_node_beam_size}) cannot be greater than the vocabulary size ({num_classes})"
            )


# p = 0 keeps the most likely token alone: a token is kept while the mass above it is below p, and every token
# but the first has some mass above it
_SMALLEST_P = 5e-324


class GumbelSampler(Sampler):
    """Stochastic beam search (Kool, van Hoof and Welling, 2019): sequences sampled without replacement.

    Each hypothesis carries ``phi_S`` (its log-probability) and ``G_phi_S`` (its perturbed value); a child's
    perturbed value is a Gumbel sample of ``phi_S + log p(token)`` conditioned on the children's maximum being
    the parent's ``G_phi_S``; beams are those with the largest perturbed values, sorted by log-probability.
    ``temperature`` flattens or sharpens the step distribution the children are perturbed from.
    """

    def __init__(self, temperature: float = 1.0) -> None:
        self.temperature = check_float("temperature", temperature, above=0)

    def init_state(self, start_class_log_probabilities: Any, batch_size: int, num_classes: int) -> StateType:
        """The first step's perturbed values ``G_phi_S`` ``[batch, V]`` (their maximum conditioned to 0)."""
        zeros = start_class_log_probabilities.new_zeros((batch_size, num_classes))
        return {"G_phi_S": self.gumbel_with_max(start_class_log_probabilities, zeros)}

    def sample_nodes(self, log_probs: Any, per_node_beam_size: int, state: StateType) -> tuple[Any, Any, StateType]:
        """Each row's ``per_node_beam_size`` children with the largest perturbed values; the state gets their
        ``G_phi_S`` ``[rows, per_node_beam_size]``."""
        import torch

        tempered = log_probs
        if self.temperature != 1.0:
            tempered = torch.log_softmax(log_probs / self.temperature, dim=-1)
        phi = state["phi_S"].unsqueeze(-1) + tempered  # shape: (rows, V)
        g = self.gumbel_with_max(phi, state["G_phi_S"].unsqueeze(-1))
        top_g, indices = torch.topk(g, per_node_beam_size, dim=-1)
        return log_probs.gather(1, indices), indices, {"G_phi_S": top_g}

    def sample_beams(self, log_probs: Any, beam_size: int, state: StateType) -> tuple[Any, Any, StateType]:
        """The ``beam_size`` candidates with the largest perturbed values, sorted by log-probability; the state
        gets their ``G_phi_S`` and ``phi_S`` ``[batch * beam_size]``."""
        batch = log_probs.shape[0]
        g = state["G_phi_S"].reshape_as(log_probs)  # shape: (batch, k)
        top_g, indices = g.topk(beam_size, dim=-1)
        chosen, order = log_probs.gather(1, indices).sort(dim=-1, descending=True)
        indices, top_g = indices.gather(1, order), top_g.gather(1, order)
        return chosen, indices, {"G_phi_S": top_g.reshape(batch * beam_size), "phi_S": chosen.reshape(-1)}

    def gumbel(self, phi: Any) -> Any:
        """A sample of ``Gumbel(phi)``, element-wise (torch's default generator)."""
        import torch

        return phi - torch.log(-torch.log(torch.rand_like(phi)))

    def gumbel_with_max(self, phi: Any, T: Any) -> Any:  # noqa: N803 (OLMo's parameter name)
        """A sample of ``Gumbel(phi)`` ``[rows, V]`` conditioned on its row maximum being ``T`` ``[rows, 1]``."""
        import torch

        g = self.gumbel(phi)
        z = g.max(dim=-1, keepdim=True).values  # shape: (rows, 1)
        v = T - g + torch.log1p(-torch.exp(g - z))
        return T - torch.relu(v) - torch.log1p(torch.exp(-v.abs()))


def top_k(x: Any, k: int) -> tuple[Any, Any]:
    """The ``k`` largest entries of each row of a torch tensor, best first, ties to the lower index: ``(values,
    indices)`` in ``x``'s dtype and device."""
    import torch

    _, idx = ops.top_candidates(x, k)  # shape: (rows, k) host
    indices = torch.as_tensor(idx, device=x.device)
    return x.gather(1, indices), indices
