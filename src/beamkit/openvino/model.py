"""``Model``: an OpenVINO IR folder read once, compiled for the CPU per precision and thread count.

The folder is optimum-intel's layout (what ``optimum-cli export openvino`` and
:func:`beamkit.openvino.export_decoder` write, what OpenVINO GenAI reads): ``openvino_model.xml`` / ``.bin``,
``config.json`` (the model's Hugging Face config), optionally ``generation_config.json`` and a tokenizer's files.
A decoder-only IR is either stateful (the keys/values are the model's internal state; ``beam_idx`` gathers its
rows inside the model) or stateless (``past_key_values.{i}.key`` / ``.value`` inputs, ``present.{i}.key`` /
``.value`` outputs).

Precisions (:data:`PRECISIONS`): ``"f32"`` computes and keeps the key/value cache in float32 (the results of
Hugging Face's float32 model), ``"bf16"`` computes in bfloat16 with a bfloat16 cache (faster where the CPU has
bfloat16 instructions; other tokens may win), ``"auto"`` leaves OpenVINO's CPU defaults (bfloat16 on CPUs with
AMX, a reduced-precision cache).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from beamkit._checks import check_choice, check_optional_int
from beamkit.extras import install_hint

IR_XML = "openvino_model.xml"
SHARED_XML = "openvino_shared_prompt_model.xml"  # beamkit's shared-prompt IR of a decoder-only folder
#: an encoder-decoder folder's IRs: the encoder, the first decoder step, the later decoder steps
SEQ2SEQ_XML = {
    "encoder": "openvino_encoder_model.xml",
    "decoder": "openvino_decoder_model.xml",
    "past": "openvino_decoder_with_past_model.xml",
}
#: files of which a folder with a tokenizer holds at least one
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "spiece.model")
LOCAL: dict[str, Any] = {
    "trust_remote_code": False,
    "local_files_only": True,
}  # read from the folder only; none of its code runs

#: precision name -> the CPU plugin's properties for it
PRECISIONS: dict[str, dict[str, str]] = {
    "f32": {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"},
    "bf16": {"INFERENCE_PRECISION_HINT": "bf16", "KV_CACHE_PRECISION": "bf16"},
    "auto": {},
}


def require() -> None:
    """ImportError naming the ``openvino`` extra unless openvino, torch and transformers import."""
    try:
        import openvino  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"beamkit.openvino needs openvino, torch and transformers: {install_hint('openvino')} ({exc})"
        ) from exc


def check_precision(precision: Any) -> str:
    """``precision`` when it is one of :data:`PRECISIONS`, else ValueError listing them."""
    return check_choice("precision", precision, tuple(PRECISIONS))


class Model:
    """An OpenVINO IR folder, read once (``Model(path)``); :meth:`compiled` compiles it for the CPU
    per ``(precision, threads)``, once each. ``config`` / ``generation_config`` are the folder's Hugging Face
    configs; ``stateful`` says whether the keys/values are the model's state, ``reorders`` whether it has a
    ``beam_idx`` input (a stateful model without one decodes greedily only); ``layers`` the past key/value input
    names of a stateless model. An encoder-decoder folder (``encoder_decoder``) holds three stateless IRs
    (:data:`SEQ2SEQ_XML`, see :mod:`beamkit.openvino.export_seq2seq`). Raises ValueError for a folder that is
    not such an IR."""

    def __init__(self, path: str | Path):
        require()
        import openvino as ov
        import transformers

        self.path = Path(path)
        if not self.path.is_dir():
            raise ValueError(f"{self.path} is not a folder (an OpenVINO IR folder holds {IR_XML})")
        if not (self.path / IR_XML).is_file() and not (self.path / SEQ2SEQ_XML["encoder"]).is_file():
            raise ValueError(
                f"{self.path} is not an OpenVINO IR folder: no {IR_XML} (export one with "
                "beamkit.openvino.export_decoder or optimum-cli export openvino)"
            )
        if not (self.path / "config.json").is_file():
            raise ValueError(f"{self.path} has no config.json (the model's Hugging Face config, saved beside the IR)")
        self.core = ov.Core()
        self.config = transformers.AutoConfig.from_pretrained(self.path, **LOCAL)
        try:
            self.generation_config = transformers.GenerationConfig.from_pretrained(self.path, **LOCAL)
        except OSError:  # no generation_config.json: the config's own defaults, as Hugging Face does
            self.generation_config = transformers.GenerationConfig.from_model_config(self.config)
        self.vocab_size = int(getattr(self.config.get_text_config(), "vocab_size", 0) or 0) or None
        self.encoder_decoder = bool(getattr(self.config, "is_encoder_decoder", False))
        self._compiled: dict[tuple[str, int | None], Any] = {}
        self._shared_compiled: dict[tuple[str, str, int | None], Any] = {}
        self.shared_ir: Any = None  # the shared-prompt IR (beamkit.openvino.export_shared), when the folder has one
        self.shared_layers = 0
        self.irs: dict[str, Any] = {}
        if self.encoder_decoder:
            self._read_seq2seq()
        else:
            self._read_decoder_only()

    def _read(self, name: str) -> Any:
        """The IR ``name`` of the folder; ValueError where it is missing or unreadable."""
        xml = self.path / name
        if not xml.is_file():
            raise ValueError(
                f"{self.path} is an encoder-decoder model's folder without {name} (beamkit reads the three IRs that "
                f"beamkit.openvino.export_seq2seq writes: {', '.join(SEQ2SEQ_XML.values())})"
            )
        try:
            return self.core.read_model(xml)
        except RuntimeError as err:
            raise ValueError(f"{xml} cannot be read as an OpenVINO IR: {str(err).splitlines()[0]}") from None

    def _read_seq2seq(self) -> None:
        """An encoder-decoder folder: the encoder, first decoder step and later decoder steps (stateless)."""
        self.irs = {kind: self._read(name) for kind, name in SEQ2SEQ_XML.items()}
        self.ir = self.irs["past"]
        names = {name for port in self.ir.inputs for name in port.get_names()}
        self.layers = sorted((n for n in names if n.startswith("past_key_values.")), key=_layer_order)
        self.takes_positions, self.reorders, self.stateful = False, True, False

    def _read_decoder_only(self) -> None:
        """A decoder-only folder: its one IR, stateful or stateless."""
        xml = self.path / IR_XML
        if not xml.is_file():
            raise ValueError(f"{self.path} is not an OpenVINO IR folder: no {IR_XML}")
        try:
            self.ir = self.core.read_model(xml)
        except RuntimeError as err:
            raise ValueError(f"{xml} cannot be read as an OpenVINO IR: {str(err).splitlines()[0]}") from None
        self.irs = {"model": self.ir}
        names = {name for port in self.ir.inputs for name in port.get_names()}
        missing = [n for n in ("input_ids", "attention_mask") if n not in names]
        outputs = {name for port in self.ir.outputs for name in port.get_names()}
        if missing or "logits" not in outputs:
            raise ValueError(
                f"{xml} is not a decoder-only language model IR: it needs inputs input_ids and attention_mask and "
                f"an output logits (missing: {', '.join(missing + ([] if 'logits' in outputs else ['logits']))})"
            )
        self.takes_positions = "position_ids" in names
        self.reorders = "beam_idx" in names
        self.layers = sorted((n for n in names if n.startswith("past_key_values.")), key=_layer_order)
        self.stateful = not self.layers
        if self.stateful and not any(op.get_type_name() == "ReadValue" for op in self.ir.get_ops()):
            raise ValueError(f"{xml} has neither a key/value state nor past_key_values inputs: it cannot decode")
        shared = self.path / SHARED_XML
        if shared.is_file():
            try:
                self.shared_ir = self.core.read_model(shared)
            except RuntimeError as err:
                raise ValueError(f"{shared} cannot be read as an OpenVINO IR: {str(err).splitlines()[0]}") from None
            names = {name for port in self.shared_ir.inputs for name in port.get_names()}
            self.shared_layers = sum(1 for n in names if n.startswith("prompt_key_values.") and n.endswith(".key"))

    def compiled(self, precision: str = "f32", threads: int | None = None) -> Any:
        """The IR compiled for the CPU at ``precision`` (:data:`PRECISIONS`) with ``threads`` inference threads
        (None: OpenVINO's default), compiled once per pair; for an encoder-decoder folder a dict of the three
        (``"encoder"``, ``"decoder"``, ``"past"``)."""
        check_precision(precision)
        threads = check_optional_int("threads", threads, 1)
        key = (precision, threads)
        if key not in self._compiled:
            props: dict[str, Any] = dict(PRECISIONS[precision])
            if threads is not None:
                props["INFERENCE_NUM_THREADS"] = threads
            compiled = {kind: self.core.compile_model(ir, "CPU", props) for kind, ir in self.irs.items()}
            self._compiled[key] = compiled if self.encoder_decoder else compiled["model"]
        return self._compiled[key]

    def compiled_shared(self, precision: str = "f32", threads: int | None = None) -> Any:
        """The folder's shared-prompt IR compiled for the CPU at ``precision`` with ``threads`` (once per pair);
        ValueError when the folder has none."""
        check_precision(precision)
        threads = check_optional_int("threads", threads, 1)
        if self.shared_ir is None:
            raise ValueError(
                f"{self.path} has no shared-prompt IR ({SHARED_XML}): export the folder with "
                "beamkit.openvino.export_decoder(..., shared_prompt=True)"
            )
        key = ("shared", precision, threads)
        if key not in self._shared_compiled:
            props: dict[str, Any] = dict(PRECISIONS[precision])
            if threads is not None:
                props["INFERENCE_NUM_THREADS"] = threads
            self._shared_compiled[key] = self.core.compile_model(self.shared_ir, "CPU", props)
        return self._shared_compiled[key]

    def forward(self, input_ids: Any, attention_mask: Any = None) -> Any:
        """The float32 logits ``[rows, V]`` of the next token after left-padded prompts ``input_ids`` ``[rows, P]``
        (an encoder-decoder model: of the first decoder token after the encoder inputs ``input_ids``);
        ``attention_mask`` default all ones; computed at ``"f32"`` from an empty cache."""
        import torch

        from beamkit.openvino.seq2seq import make_step

        ids = torch.as_tensor(input_ids, dtype=torch.long)
        mask = torch.ones_like(ids) if attention_mask is None else torch.as_tensor(attention_mask, dtype=torch.long)
        step = make_step(self)
        start = int(self.config.decoder_start_token_id) if self.encoder_decoder else 0
        logits, _ = step(step.init_state(ids, mask), np.full(ids.shape[0], start, dtype=np.int64))
        return logits.clone()

    __call__ = forward

    def tokenizer(self) -> Any:
        """The folder's Hugging Face tokenizer; ValueError when the folder has none."""
        import transformers

        hint = "save one beside the IR: tokenizer.save_pretrained(folder)"
        if not any((self.path / name).is_file() for name in TOKENIZER_FILES):
            raise ValueError(f"{self.path} has no tokenizer ({hint})")  # (transformers would make an empty one)
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(self.path, **LOCAL)
        except (OSError, ValueError, TypeError) as err:
            why = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ValueError(f"{self.path} has no tokenizer it can read ({hint}): {why}") from None
        if len(tokenizer) <= 1:
            raise ValueError(f"{self.path} has no tokenizer: the one in the folder holds no vocabulary ({hint})")
        return tokenizer

    def __repr__(self) -> str:
        kind = "stateful" if self.stateful else "stateless"
        return f"beamkit.openvino.Model({str(self.path)!r}, {kind}, beam_idx={self.reorders})"


def _layer_order(name: str) -> tuple[int, str]:
    """``past_key_values.{i}.key`` sorts by layer, then key before value."""
    parts = name.split(".")
    return (int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else 0, parts[-1])
