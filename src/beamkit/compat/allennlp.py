"""AllenNLP's beam search API (``allennlp.nn.beam_search``): the same classes as :mod:`beamkit.compat.olmo`."""

from beamkit.compat.olmo import *  # noqa: F403 (the same public names, listed once in beamkit.compat.olmo)
from beamkit.compat.olmo import __all__  # noqa: F401
