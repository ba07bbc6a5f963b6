"""A decoding step that runs a Hugging Face model's layers directly: one token per row, no model wrapper.

A decoder-only model's forward does a lot per call besides its layers: it parses keywords, builds the attention
masks and position embeddings' inputs, checks and wraps the cache, returns output records, and each module call
goes through ``nn.Module.__call__`` (hooks, checks). On a small model that is most of a decoding step's time
(a 2 x 64 GPT-2: about 1.1 ms of model call against 0.4 ms of arithmetic). :class:`DirectStep` runs the same
layers in the same order with the same functions: each layer's own ``forward`` (embeddings, norms, linear layers,
the model module's own rotary helper) and the attention function the model is configured with (transformers'
attention registry), on the same inputs: the token ids ``[rows, 1]``, the ready 4-D boolean padding mask
``[rows, 1, 1, L]`` and the position ids ``[rows, 1]`` that :class:`~beamkit.hf.steps.step.DecoderOnlyStep` passes
the model, and the model's own ``DynamicCache`` (its plain layers extended by ``update`` as the model does). So
its logits are the model call's logits, bit for bit (the tests compare them with ``torch.equal``).

It serves the families whose layer structure it knows, exactly: GPT-2 (``GPT2LMHeadModel``), the Llama-style
models (``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM``) with full attention in every layer,
and the decoders of Marian (``MarianMTModel``), BART (``BartForConditionalGeneration``), T5
(``T5ForConditionalGeneration``, float32 or bfloat16: in float16 its blocks clamp activations) and Whisper
(``WhisperForConditionalGeneration``, whose steps beamkit's decoding loop inside Hugging Face's own ``generate``
runs, :mod:`beamkit.hf.loop`), whose one-token step reads the cross-attention keys/values the first step (a model
call) cached; with SDPA attention, in evaluation mode, with no hooks on any module when the step is made (but
transformers' own output-capturing hooks, which do nothing outside a call that asks for attentions or hidden
states). For any other model, :func:`direct_step` says why not
and the step calls the model as usual.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from beamkit.hf.internals import attention_name

#: the model classes served, by family ("gpt2": GPT-2 blocks; "llama": pre-norm blocks with rotary positions)
FAMILIES = {
    "GPT2LMHeadModel": "gpt2",
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "llama",
    "MarianMTModel": "marian",
    "BartForConditionalGeneration": "bart",
    "T5ForConditionalGeneration": "t5",
    "WhisperForConditionalGeneration": "whisper",
}
#: per family, the class names of the layers the direct step calls into (it runs their parts itself, so any
#: other class, even a subclass, may compute something else): blocks, attention, feed-forward
_LAYERS = {
    "gpt2": ({"GPT2Block"}, {"GPT2Attention"}, {"GPT2MLP"}),
    "llama": (
        {"LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer"},
        {"LlamaAttention", "MistralAttention", "Qwen2Attention"},
        {"LlamaMLP", "MistralMLP", "Qwen2MLP"},
    ),
    "marian": ({"MarianDecoderLayer"}, {"MarianAttention"}, set()),
    "bart": ({"BartDecoderLayer"}, {"BartAttention"}, set()),
    "t5": ({"T5Block"}, {"T5Attention"}, {"T5LayerFF"}),
    "whisper": ({"WhisperDecoderLayer"}, {"WhisperAttention"}, set()),
}
#: the encoder-decoder families (their decoders run directly): the engine bridge decodes the first three;
#: Whisper's steps run inside Hugging Face's own generate (:mod:`beamkit.hf.loop`), which prepares its audio inputs
SEQ2SEQ = ("marian", "bart", "t5", "whisper")
#: where the modules the direct step runs as they are may come from: the libraries' own layers
_LIBRARIES = ("transformers.", "torch.", "beamkit.")


def direct_step(model: Any) -> tuple[DirectStep | None, str]:
    """A :class:`DirectStep` for ``model`` and ``"direct"``, or ``None`` and the reason it cannot run directly."""
    reason = _unsupported(model)
    if reason:
        return None, reason
    return DirectStep(model), "direct"


def _unsupported(model: Any) -> str:
    """Why ``model``'s decoding step cannot run directly ('' when it can): the model, each of its modules and
    their configs are checked once (the step checks the cheap conditions again at every call)."""
    name = type(model).__name__
    family = FAMILIES.get(name)
    if family is None:
        return f"{name} is not a model family the direct step knows ({', '.join(sorted(FAMILIES))})"
    reason = _changed(model)
    if reason:
        return reason
    cfg = model.config
    for path, module in model.named_modules():
        where = f"{path or 'the model'} ({type(module).__name__})"
        if module.training:
            return f"{where} is in training mode (dropout would apply)"
        if module._forward_pre_hooks or not all(map(_capturing, module._forward_hooks.values())):
            return f"{where} has forward hooks"
        if "forward" in vars(module) or hasattr(module, "_hf_hook"):
            return f"{where} has its forward replaced"
        if not type(module).__module__.startswith(_LIBRARIES):
            return f"{where} comes from {type(module).__module__}, not from transformers or torch"
        own = getattr(module, "config", None)
        if own is not None and own is not cfg and attention_name(own) not in (None, "sdpa"):
            return f"{where} attends with {attention_name(own)!r} (the direct step runs 'sdpa')"
    blocks, count = _blocks(model, family)
    if len(blocks) != count:
        return f"{len(blocks)} layers against {count} in the config (the model runs the config's count)"
    block_types, attention_types, mlp_types = _LAYERS[family]
    for block in blocks:
        attn, cross, mlp = _parts(block, family)
        if type(block).__name__ not in block_types:
            return f"a {type(block).__name__} layer"
        for part in (attn, cross) if cross is not None else (attn,):
            if type(part).__name__ not in attention_types:
                return f"a {type(part).__name__} attention layer"
        if mlp is not None and type(mlp).__name__ not in mlp_types:
            return f"a {type(mlp).__name__} feed-forward layer"
    if family == "t5":
        if not isinstance(getattr(cfg, "scale_decoder_outputs", None), bool):
            return "a T5 config without scale_decoder_outputs (another transformers release)"
        parts = [type(p).__name__ for b in blocks for p in b.layer]
        if parts != ["T5LayerSelfAttention", "T5LayerCrossAttention", "T5LayerFF"] * len(blocks):
            return "T5 blocks of other parts than self-attention, cross-attention and feed-forward"
        if model.dtype == torch.float16:
            return "T5 in float16 (its blocks clamp their activations there)"
        if not blocks[0].layer[0].SelfAttention.has_relative_attention_bias:
            return "a T5 decoder whose first layer has no relative attention bias"
    if family == "gpt2" and getattr(cfg, "add_cross_attention", False):
        return "GPT-2 with cross-attention"
    if family == "llama":
        types = set(getattr(cfg, "layer_types", None) or ["full_attention"])
        window = getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", 1)
        if types != {"full_attention"} or window:
            return "a sliding-window attention layer"
        if not callable(getattr(sys.modules[type(blocks[0].self_attn).__module__], "apply_rotary_pos_emb", None)):
            return "the model's module has no apply_rotary_pos_emb"
    return ""


def _capturing(hook: Any) -> bool:
    """Whether ``hook`` is transformers' own output-capturing hook: installed for good on a model's layers by
    its first call that returns attentions or hidden states, it does nothing outside such a call of the model's
    forward (the direct step never makes one)."""
    return getattr(hook, "__module__", None) == "transformers.utils.output_capturing" and (
        getattr(hook, "__name__", None) == "output_capturing_hook"
    )


def _changed(model: Any) -> str:
    """The conditions that may change after the step is made, cheap enough to check at every call: training
    mode, the attention function, global module hooks ('' when the direct step may run)."""
    if model.training:
        return "the model is in training mode (dropout would apply)"
    implementation = attention_name(model.config)
    if implementation != "sdpa":
        return f"attention implementation {implementation!r} (the direct step runs 'sdpa')"
    if torch.nn.modules.module._global_forward_hooks or torch.nn.modules.module._global_forward_pre_hooks:
        return "global module hooks are registered"
    return ""


def _parts(block: Any, family: str) -> tuple[Any, Any, Any]:
    """A block's self-attention, cross-attention (None in decoder-only families) and feed-forward (None where
    the block holds its feed-forward layers directly) modules."""
    if family == "t5":
        layer = block.layer
        cross = layer[1].EncDecAttention if len(layer) > 2 else None
        return layer[0].SelfAttention, cross, layer[-1]
    attn = block.attn if family == "gpt2" else block.self_attn
    mlp = block.mlp if family in ("gpt2", "llama") else None
    return attn, getattr(block, "encoder_attn", None), mlp


def _blocks(model: Any, family: str) -> tuple[Any, int]:
    """The layers a family's model loops over, and how many its config says it runs."""
    cfg = model.config
    if family == "gpt2":
        return model.transformer.h, int(cfg.n_layer)
    if family == "llama":
        return model.model.layers, int(cfg.num_hidden_layers)
    if family == "t5":
        return model.decoder.block, int(cfg.num_decoder_layers)
    return model.model.decoder.layers, int(cfg.decoder_layers)


class DecoderToken(NamedTuple):
    """One new token per row for an encoder-decoder model's decoder layers: its ids ``[rows, 1]``, the encoder's
    padding mask ``[rows, 1, 1, S]`` (None: no padding), the model's ``EncoderDecoderCache`` (the cross-attention
    keys/values filled), and for a cache of fixed width the ``position`` ``[1]`` and the self-attention columns
    to read (``self_mask`` ``[rows, 1, 1, C]``)."""

    ids: torch.Tensor
    cross_mask: torch.Tensor | None
    cache: Any
    position: torch.Tensor | None = None
    self_mask: torch.Tensor | None = None

    def caches(self) -> tuple[Any, Any]:
        """The self-attention and the cross-attention caches."""
        return self.cache.self_attention_cache, self.cache.cross_attention_cache


class DirectStep:
    """One decoding step of a known decoder-only model family, its layers called directly (see the module doc).

    ``__call__(ids [rows, 1], mask [rows, 1, 1, L] boolean, pos [rows, 1], cache)``: the next-token logits
    ``[rows, V]`` (float32), the cache's layers extended by this step's keys and values.
    """

    def __init__(self, model: Any):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        self.model = model
        self.family = FAMILIES[type(model).__name__]
        self.reason = ""  # why the last call was refused ('' when it ran)
        self.attend: Callable[..., Any] = ALL_ATTENTION_FUNCTIONS["sdpa"]
        self._range = torch.arange(256, device=model.device)  # position ids, sliced (encoder-decoder models)
        if self.family == "llama":
            attn = model.model.layers[0].self_attn
            self.rotary: Callable[..., Any] = sys.modules[type(attn).__module__].apply_rotary_pos_emb

    def usable(self) -> bool:
        """Whether the step may still run directly: the model is still in evaluation mode, attends with SDPA and
        no global module hook was registered (``self.reason`` says why not). Hooks or training mode set on one
        layer after the step was made are not seen: make the step again after changing the model's layers."""
        self.reason = _changed(self.model)
        return not self.reason

    def __call__(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor | None,
        pos: torch.Tensor | None,
        cache: Any,
        self_mask: torch.Tensor | None = None,
        head: Any = None,
    ) -> torch.Tensor:
        """The logits ``[rows, V]`` of one token per row (see the class doc). An encoder-decoder model takes the
        encoder's padding mask ``[rows, 1, 1, S]`` as ``mask``, its ``EncoderDecoderCache`` (the cross-attention
        keys/values filled) and no ``pos`` (its position is the decoder's length, the same for every row, read
        from the cache); or, for a cache of fixed width (the compiled step), ``pos`` the position ``[1]`` and
        ``self_mask`` ``[rows, 1, 1, C]`` the self-attention columns to read. Whisper's decoder takes no encoder
        mask (``None``: its audio frames have no padding). ``head``: an output layer to run in place of a
        decoder-only model's ``lm_head`` (:func:`beamkit.hf.steps.step.output_head`), whose columns it returns."""
        if self.family == "t5":
            logits = self.model.lm_head.forward(self._t5(DecoderToken(ids, mask, cache, pos, self_mask)))
        elif self.family == "whisper":
            logits = self.model.proj_out.forward(self._whisper(DecoderToken(ids, mask, cache, pos, self_mask)))
        elif self.family in SEQ2SEQ:
            hidden = self._seq2seq(DecoderToken(ids, mask, cache, pos, self_mask))
            logits = self.model.lm_head.forward(hidden) + self.model.final_logits_bias
        else:
            assert pos is not None
            hidden = self._gpt2(ids, mask, pos, cache) if self.family == "gpt2" else self._llama(ids, mask, pos, cache)
            logits = (self.model.lm_head if head is None else head).forward(hidden)
        logits = logits[:, -1, :]  # shape: (rows, V)
        return logits if logits.dtype == torch.float32 else logits.float()

    def _gpt2(self, ids: torch.Tensor, mask: torch.Tensor | None, pos: torch.Tensor, cache: Any) -> torch.Tensor:
        """GPT-2's blocks (``GPT2Model.forward`` for one new token): the final hidden states ``[rows, 1, E]``."""
        tr = self.model.transformer
        hidden = tr.wte.forward(ids) + tr.wpe.forward(pos)  # shape: (rows, 1, E)
        rows = hidden.shape[0]
        for i, block in enumerate(tr.h):
            attn = block.attn
            x = block.ln_1.forward(hidden)
            q, k, v = attn.c_attn.forward(x).split(attn.split_size, dim=2)  # each: (rows, 1, E)
            q = q.view(rows, 1, -1, attn.head_dim).transpose(1, 2)  # shape: (rows, heads, 1, d)
            k = k.view(rows, 1, -1, attn.head_dim).transpose(1, 2)
            v = v.view(rows, 1, -1, attn.head_dim).transpose(1, 2)
            k, v = cache.layers[i].update(k, v)  # shape: (rows, heads, L, d)
            out, _ = self.attend(attn, q, k, v, mask, dropout=0.0, scaling=attn.scaling)
            out = out.reshape(rows, 1, -1).contiguous()  # shape: (rows, 1, E)
            hidden = attn.c_proj.forward(out) + hidden
            x = block.ln_2.forward(hidden)
            mlp = block.mlp
            hidden = hidden + mlp.c_proj.forward(mlp.act(mlp.c_fc.forward(x)))
        return tr.ln_f.forward(hidden)

    def _llama(self, ids: torch.Tensor, mask: torch.Tensor | None, pos: torch.Tensor, cache: Any) -> torch.Tensor:
        """Llama-style blocks (``LlamaModel.forward`` for one new token): the final hidden states ``[rows, 1, E]``."""
        base = self.model.model
        hidden = base.embed_tokens.forward(ids)  # shape: (rows, 1, E)
        rows = hidden.shape[0]
        cos, sin = base.rotary_emb(hidden, pos)  # each: (rows, 1, d)
        for i, layer in enumerate(base.layers):
            attn = layer.self_attn
            x = layer.input_layernorm.forward(hidden)
            shape = (rows, 1, -1, attn.head_dim)
            q = attn.q_proj.forward(x).view(shape).transpose(1, 2)  # shape: (rows, heads, 1, d)
            k = attn.k_proj.forward(x).view(shape).transpose(1, 2)  # shape: (rows, kv heads, 1, d)
            v = attn.v_proj.forward(x).view(shape).transpose(1, 2)
            q, k = self.rotary(q, k, cos, sin)
            k, v = cache.layers[i].update(k, v)  # shape: (rows, kv heads, L, d)
            out, _ = self.attend(attn, q, k, v, mask, dropout=0.0, scaling=attn.scaling)
            hidden = attn.o_proj.forward(out.reshape(rows, 1, -1).contiguous()) + hidden
            x = layer.post_attention_layernorm.forward(hidden)
            mlp = layer.mlp
            hidden = hidden + mlp.down_proj.forward(mlp.act_fn(mlp.gate_proj.forward(x)) * mlp.up_proj.forward(x))
        return base.norm.forward(hidden)

    def _seq2seq(self, token: DecoderToken) -> torch.Tensor:
        """Marian / BART decoder layers (``MarianDecoder`` / ``BartDecoder.forward`` for one new token, post-norm):
        the final hidden states ``[rows, 1, E]``. The self-attention needs no mask: one query attends to every
        position of its own row (the model passes none either, having no decoder padding); a cache of fixed
        width passes ``self_mask`` and the ``position`` (then its length is not read)."""
        ids, cross_mask, position, self_mask = token.ids, token.cross_mask, token.position, token.self_mask
        dec, (self_cache, cross_cache) = self.model.model.decoder, token.caches()
        past = 0  # read by the position embeddings only when no position ids are given (never here)
        if position is None:
            past = self_cache.get_seq_length()
            position = self._positions(past)  # shape: (1,)
        if self.family == "marian":
            hidden = dec.embed_tokens.forward(ids) * dec.embed_scale  # shape: (rows, 1, E)
            hidden = hidden + dec.embed_positions.forward(ids.shape, past, position_ids=position)
        else:
            hidden = dec.embed_tokens.forward(ids) + dec.embed_positions.forward(ids, past, position_ids=position)
            hidden = dec.layernorm_embedding.forward(hidden)
        rows = hidden.shape[0]
        for i, layer in enumerate(dec.layers):
            attn, cross = layer.self_attn, layer.encoder_attn
            shape = (rows, 1, -1, attn.head_dim)
            q = attn.q_proj.forward(hidden).view(shape).transpose(1, 2)  # shape: (rows, heads, 1, d)
            k = attn.k_proj.forward(hidden).view(shape).transpose(1, 2)
            v = attn.v_proj.forward(hidden).view(shape).transpose(1, 2)
            k, v = self_cache.layers[i].update(k, v)  # shape: (rows, heads, L, d)
            out, _ = self.attend(attn, q, k, v, self_mask, dropout=0.0, scaling=attn.scaling)
            out = attn.out_proj.forward(out.reshape(rows, 1, -1).contiguous())  # shape: (rows, 1, E)
            hidden = layer.self_attn_layer_norm.forward(hidden + out)
            q = cross.q_proj.forward(hidden).view(shape).transpose(1, 2)
            kv = cross_cache.layers[i]  # shape: (rows, heads, S, d) each, filled at the first step
            out, _ = self.attend(cross, q, kv.keys, kv.values, cross_mask, dropout=0.0, scaling=cross.scaling)
            out = cross.out_proj.forward(out.reshape(rows, 1, -1).contiguous())
            hidden = layer.encoder_attn_layer_norm.forward(hidden + out)
            ffn = layer.fc2.forward(layer.activation_fn(layer.fc1.forward(hidden)))
            hidden = layer.final_layer_norm.forward(hidden + ffn)
        return hidden

    def _t5(self, token: DecoderToken) -> torch.Tensor:
        """T5 decoder blocks (``T5Stack.forward`` of the decoder for one new token, pre-norm, relative position
        bias from the first block's self-attention, shared by every block; the cross-attention's bias zeros):
        the final hidden states ``[rows, 1, E]``, scaled as ``T5ForConditionalGeneration`` scales them before its
        output layer. As the model, the self-attention passes no mask but the bias (one query attends to its
        row's every position); a cache of fixed width passes ``self_mask`` and the ``position``."""
        ids, cross_mask, position, self_mask = token.ids, token.cross_mask, token.position, token.self_mask
        dec, (self_cache, cross_cache) = self.model.decoder, token.caches()
        past: Any = position if position is not None else self_cache.get_seq_length()
        hidden = dec.embed_tokens.forward(ids)  # shape: (rows, 1, E)
        rows = hidden.shape[0]
        bias = cross_bias = None
        for i, block in enumerate(dec.block):
            own, cross, ff = block.layer
            attn = own.SelfAttention
            x = own.layer_norm.forward(hidden)
            shape = (rows, 1, -1, attn.key_value_proj_dim)
            q = attn.q.forward(x).view(shape).transpose(1, 2)  # shape: (rows, heads, 1, d)
            k = attn.k.forward(x).view(shape).transpose(1, 2)
            v = attn.v.forward(x).view(shape).transpose(1, 2)
            k, v = self_cache.layers[i].update(k, v)  # shape: (rows, heads, L, d)
            if bias is None:  # shape: (1, heads, 1, L)
                bias = attn.compute_bias(1, k.shape[-2], device=q.device, past_seen_tokens=past)
            out, _ = self.attend(attn, q, k, v, self_mask, dropout=0.0, scaling=attn.scaling, position_bias=bias)
            hidden = hidden + attn.o.forward(out.reshape(rows, 1, -1).contiguous())
            attn = cross.EncDecAttention
            q = attn.q.forward(cross.layer_norm.forward(hidden)).view(shape).transpose(1, 2)
            kv = cross_cache.layers[i]  # shape: (rows, heads, S, d) each, filled at the first step
            if cross_bias is None:  # shape: (1, heads, 1, S) no relative bias across
                cross_bias = torch.zeros((1, attn.n_heads, 1, kv.keys.shape[-2]), device=q.device, dtype=q.dtype)
            out, _ = self.attend(
                attn, q, kv.keys, kv.values, cross_mask, dropout=0.0, scaling=attn.scaling, position_bias=cross_bias
            )
            hidden = hidden + attn.o.forward(out.reshape(rows, 1, -1).contiguous())
            hidden = ff.forward(hidden)
        hidden = dec.final_layer_norm.forward(hidden)
        if self.model.config.scale_decoder_outputs:
            hidden = hidden * (self.model.model_dim**-0.5)
        return hidden

    def _whisper(self, token: DecoderToken) -> torch.Tensor:
        """Whisper decoder layers (``WhisperDecoder.forward`` for one new token, pre-norm, learned positions, the
        queries scaled before attention): the final hidden states ``[rows, 1, E]``. As the model, the
        self-attention passes no mask for one query over its row's every position, and the cross-attention the
        encoder's mask only where one is given (Whisper's own decoder passes none: its audio frames have no
        padding); a cache of fixed width passes ``self_mask`` and the ``position``."""
        ids, cross_mask, position, self_mask = token.ids, token.cross_mask, token.position, token.self_mask
        dec, (self_cache, cross_cache) = self.model.model.decoder, token.caches()
        if position is None:
            position = self._positions(self_cache.get_seq_length())  # shape: (1,)
        hidden = dec.embed_tokens.forward(ids) + dec.embed_positions.weight[position]  # shape: (rows, 1, E)
        rows = hidden.shape[0]
        for i, layer in enumerate(dec.layers):
            attn, cross = layer.self_attn, layer.encoder_attn
            shape = (rows, 1, -1, attn.head_dim)
            x = layer.self_attn_layer_norm.forward(hidden)
            q = (attn.q_proj.forward(x) * attn.scaling).view(shape).transpose(1, 2).contiguous()  # (rows, heads, 1, d)
            k = attn.k_proj.forward(x).view(shape).transpose(1, 2).contiguous()
            v = attn.v_proj.forward(x).view(shape).transpose(1, 2).contiguous()
            k, v = self_cache.layers[i].update(k, v)  # shape: (rows, heads, L, d)
            out, _ = self.attend(attn, q, k, v, self_mask, dropout=0.0, scaling=1.0)
            hidden = hidden + attn.out_proj.forward(out.reshape(rows, 1, -1).contiguous())
            x = layer.encoder_attn_layer_norm.forward(hidden)
            q = (cross.q_proj.forward(x) * cross.scaling).view(shape).transpose(1, 2).contiguous()
            kv = cross_cache.layers[i]  # shape: (rows, heads, S, d) each, filled at the first step
            out, _ = self.attend(cross, q, kv.keys, kv.values, cross_mask, dropout=0.0, scaling=1.0)
            hidden = hidden + cross.out_proj.forward(out.reshape(rows, 1, -1).contiguous())
            x = layer.final_layer_norm.forward(hidden)
            hidden = hidden + layer.fc2.forward(layer.activation_fn(layer.fc1.forward(x)))
        return dec.layer_norm.forward(hidden)

    def _positions(self, past: int) -> torch.Tensor:
        """``[past]`` as a one-element int64 tensor on the model's device (a slice of a kept range)."""
        if past >= self._range.shape[0]:
            self._range = torch.arange(2 * past + 64, device=self._range.device)
        return self._range[past : past + 1]
