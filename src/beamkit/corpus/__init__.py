"""Corpus decoding: files in, JSONL out, resumable shards, on local worker processes or Ray.

``beamkit decode`` and :func:`decode_corpus` read a corpus, decode it batch by batch with a model loaded once
per worker, and write shards that a rerun keeps; :func:`decode_dataset` adds decoding to a Ray Data pipeline.
"""

from beamkit.corpus.decoder import CorpusDecoder, record
from beamkit.corpus.inputs import Item, read_inputs
from beamkit.corpus.options import DecodeOptions
from beamkit.corpus.ray_backend import decode_dataset
from beamkit.corpus.run import CorpusResult, decode_corpus

__all__ = [
    "CorpusResult",
    "DecodeOptions",
    "CorpusDecoder",
    "Item",
    "decode_corpus",
    "decode_dataset",
    "read_inputs",
    "record",
]
