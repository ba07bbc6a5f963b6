"""Drop-in replacements for other libraries' search APIs, run by beamkit's engine.

:mod:`beamkit.compat.olmo` is OLMo's ``olmo.beam_search`` (AllenNLP's pluggable beam search); the same module is
importable as :mod:`beamkit.compat.allennlp`.
"""
