"""OLMo's beam search (``olmo.beam_search``, AllenNLP's design) as a drop-in, run by beamkit's engine.

Change one import line::

    from beamkit.compat.olmo import BeamSearch, TopKSampler  # was: from olmo.beam_search import ...

``BeamSearch(end_index, max_steps=50, beam_size=10, ...).search(start_predictions, start_state, step)`` returns
OLMo's ``(predictions [batch, beam, steps], log_probabilities [batch, beam])``; samplers, constraints and final
scorers keep OLMo's protocols, user subclasses included. What differs is listed in :mod:`beamkit.compat.olmo.search`.
"""

from beamkit.compat.olmo.constraints import Constraint, ConstraintStateType, RepeatedNGramBlockingConstraint
from beamkit.compat.olmo.samplers import (
    DeterministicSampler,
    GumbelSampler,
    MultinomialSampler,
    Sampler,
    StateType,
    TopKSampler,
    TopPSampler,
)
from beamkit.compat.olmo.scorers import (
    FinalSequenceScorer,
    LengthNormalizedSequenceLogProbabilityScorer,
    SequenceLogProbabilityScorer,
)
from beamkit.compat.olmo.search import (
    BeamSearch,
    StepFunctionType,
    StepFunctionTypeNoTimestep,
    StepFunctionTypeWithTimestep,
)

__all__ = [
    "BeamSearch",
    "Constraint",
    "ConstraintStateType",
    "DeterministicSampler",
    "FinalSequenceScorer",
    "GumbelSampler",
    "LengthNormalizedSequenceLogProbabilityScorer",
    "MultinomialSampler",
    "RepeatedNGramBlockingConstraint",
    "Sampler",
    "SequenceLogProbabilityScorer",
    "StateType",
    "StepFunctionType",
    "StepFunctionTypeNoTimestep",
    "StepFunctionTypeWithTimestep",
    "TopKSampler",
    "TopPSampler",
]
