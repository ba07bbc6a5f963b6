"""The output layer: generative retrieval over a dictionary's allowed ids.

With ``allowed_output=`` and a :class:`beamkit.Trie`'s ``prefix_allowed_tokens_fn``,
:class:`~beamkit.hf.retrieval.allowed.AllowedOutputStep` wraps a step function of :mod:`beamkit.hf.steps`, follows
each row's trie node and computes the output layer only for the ids some row may take
(:mod:`~beamkit.hf.retrieval.allowed`), normalised over each row's allowed ids or over the whole vocabulary. The
model's own output layer is read, never replaced.
"""
