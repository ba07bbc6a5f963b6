"""beamkit's search over OpenVINO-compiled models: ``beamkit.openvino.generate(folder, input_ids, ...)``.

:class:`~beamkit.openvino.model.Model` reads an OpenVINO IR folder (optimum-intel's layout) once and compiles it
per precision; :mod:`~beamkit.openvino.step` is the engine's step function over it (the keys/values stay inside
the model's state, ``beam_idx`` reorders them); :mod:`~beamkit.openvino.generation` is ``generate``, taking what
:func:`beamkit.hf.generate` takes; :mod:`~beamkit.openvino.export` converts a ``transformers`` decoder-only model
to such a folder (:func:`export_decoder`); :mod:`~beamkit.openvino.shared` decodes on a folder's shared-prompt IR
(:mod:`~beamkit.openvino.export_shared`: a request's prompt keys/values held once, whatever its beam count).

Needs ``openvino``, ``torch`` and ``transformers`` (``pip install ".[openvino]"``), imported when this module is.
"""

from beamkit.openvino.export import export_decoder
from beamkit.openvino.export_seq2seq import export_seq2seq
from beamkit.openvino.export_shared import export_shared_prompt
from beamkit.openvino.generation import as_model, generate
from beamkit.openvino.model import PRECISIONS, Model
from beamkit.openvino.seq2seq import OVSeq2SeqStep, Seq2SeqRows, make_step
from beamkit.openvino.shared import OVSharedPromptStep, SharedRows
from beamkit.openvino.step import OVDecoderStep, OVRows, StaleState

__all__ = [
    "PRECISIONS",
    "Model",
    "OVDecoderStep",
    "OVRows",
    "OVSeq2SeqStep",
    "OVSharedPromptStep",
    "Seq2SeqRows",
    "SharedRows",
    "StaleState",
    "as_model",
    "export_decoder",
    "export_seq2seq",
    "export_shared_prompt",
    "generate",
    "make_step",
]
