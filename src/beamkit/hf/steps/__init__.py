"""The steps: step functions ``step(state, y_prev) -> (logits, state)`` over a Hugging Face model and its cache.

:class:`~beamkit.hf.steps.step.DecoderOnlyStep` and :class:`~beamkit.hf.steps.step.EncoderDecoderStep` run the
prompt once per request and then one token per live row (:mod:`~beamkit.hf.steps.step`, requests joining
mid-flight in :mod:`~beamkit.hf.steps.join`); each decoding step runs one of three ways, chosen once when the
step function is made: through the model's forward over its dense or paged cache (:mod:`~beamkit.hf.steps.paged`:
keys/values in beamkit's block pool), directly over a known family's layers (:mod:`~beamkit.hf.steps.direct`), or
compiled over static shapes (:mod:`~beamkit.hf.steps.compiled`). What a step keeps of its own (compiled graphs,
the paged attention function) is kept beside the model, never on it.
"""
