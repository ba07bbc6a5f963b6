"""The Transformer of :mod:`beamkit.models.transformer` in float32 numpy: inference only, same weights.

The same computation as the torch :class:`~beamkit.models.transformer.Transformer` in eval mode (pre-LN blocks,
learned positions, dropout off) with its dense incremental cache: the step feeds only the newest token, each
decoder layer's self-attention keys/values live in the :class:`NumpyTransformerState` (``(rows, heads, t,
d_head)``, gathered by beam), the cross-attention keys/values are computed once per request and travel in a
``beamkit.Shared``. Rows of requests that joined a running search carry their own ``length`` (their keys right
aligned, the padding masked), as in the torch state. The paged KV cache and decoder prefixes are torch only.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from beamkit.models.common import join_cross, join_self_cache, transformer_config, trim_self_cache
from beamkit.models.numpy_nn import Params, layer_norm, linear, softmax
from beamkit.models.vocab import Vocab
from beamkit.state import Shared


class NumpyTransformerState(NamedTuple):
    """Decoder state of :class:`NumpyTransformer`; array leaves have one row per live hypothesis."""

    self_k: tuple[np.ndarray, ...]  # per layer, float32, shape: (rows, heads, t, d_head)
    self_v: tuple[np.ndarray, ...]  # per layer, float32, shape: (rows, heads, t, d_head)
    req: np.ndarray  # request of each row, int64, shape: (rows,)
    cross: Any  # Shared((k per layer (B, heads, S, d_head), v per layer, src mask (B, S) bool))
    # positions each row holds, shape: (rows,), when rows of different lengths share the cache (requests that
    # joined a running search): each row's keys/values right-aligned in the t columns, padding masked.
    # None: every row holds all t positions.
    length: np.ndarray | None = None

    def kv_bytes(self) -> int:
        """Bytes held by the self-attention cache."""
        return sum(int(x.nbytes) for x in (*self.self_k, *self.self_v))

    def beamkit_concat(self, others: list[NumpyTransformerState]) -> NumpyTransformerState:
        """Join the rows of requests added to a running search (``beamkit.concat_state``): self-attention caches
        left-padded to the longest (``length`` records each row's own), cross-attention keys/values of the
        requests still decoding joined (sources padded, masked), request indices renumbered."""
        parts = [self, *others]
        req, cross = join_cross(parts)
        k, v, length = join_self_cache(parts)
        return NumpyTransformerState(k, v, req, cross, length)


class _Attention:
    """Multi-head attention weights (``q``, ``k``, ``v``, ``o`` linears) of one torch ``_Attention``."""

    def __init__(self, params: Params, prefix: str, d_model: int, heads: int) -> None:
        self.heads, self.d_head = heads, d_model // heads
        self.scale = np.float32(math.sqrt(self.d_head))
        self.proj = {
            name: (
                params.take(f"{prefix}.{name}.weight", (d_model, d_model)),
                params.take(f"{prefix}.{name}.bias", (d_model,)),
            )
            for name in ("q", "k", "v", "o")
        }

    def split(self, x: np.ndarray) -> np.ndarray:
        """(B, T, D) -> (B, heads, T, d_head)."""
        b, t, _ = x.shape
        return x.reshape(b, t, self.heads, self.d_head).transpose(0, 2, 1, 3)

    def project(self, name: str, x: np.ndarray) -> np.ndarray:
        """The ``q``/``k``/``v`` projection of ``x`` (B, T, D), split into heads (B, heads, T, d_head)."""
        return self.split(linear(x, *self.proj[name]))

    def attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        """Scaled dot-product attention; ``mask`` broadcasts to (B, heads, Tq, Tk), True = may attend."""
        scores = np.matmul(q, k.swapaxes(-1, -2)) / self.scale  # shape: (B, heads, Tq, Tk)
        if mask is not None:
            scores = np.where(mask, scores, np.float32(-np.inf))
        out = np.matmul(softmax(scores), v)  # shape: (B, heads, Tq, d_head)
        b, _, t, _ = out.shape
        return linear(out.transpose(0, 2, 1, 3).reshape(b, t, self.heads * self.d_head), *self.proj["o"])


class _Block:
    """The layer norms, attentions and feed-forward weights of one encoder or decoder layer."""

    def __init__(self, params: Params, prefix: str, d_model: int, heads: int, ff: int, decoder: bool) -> None:
        p = params.take
        norms = ("ln1", "ln2", "ln3") if decoder else ("ln1", "ln2")
        self.ln = [(p(f"{prefix}.{n}.weight", (d_model,)), p(f"{prefix}.{n}.bias", (d_model,))) for n in norms]
        first = "self_attn" if decoder else "attn"
        self.attn = _Attention(params, f"{prefix}.{first}", d_model, heads)
        self.cross = _Attention(params, f"{prefix}.cross_attn", d_model, heads) if decoder else None
        self.ff = (
            (p(f"{prefix}.ff.0.weight", (ff, d_model)), p(f"{prefix}.ff.0.bias", (ff,))),
            (p(f"{prefix}.ff.2.weight", (d_model, ff)), p(f"{prefix}.ff.2.bias", (d_model,))),
        )

    def feed_forward(self, x: np.ndarray) -> np.ndarray:
        """``Linear -> ReLU -> Linear`` of the last layer norm's output of ``x``."""
        h = np.maximum(linear(layer_norm(x, *self.ln[-1]), *self.ff[0]), np.float32(0.0))
        return x + linear(h, *self.ff[1])

    def encode(self, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """An encoder layer over ``x`` (B, S, D) with the source ``mask`` (B, S)."""
        h = layer_norm(x, *self.ln[0])
        a = self.attn
        x = x + a.attend(a.project("q", h), a.project("k", h), a.project("v", h), mask[:, None, None, :])
        return self.feed_forward(x)

    def cross_kv(self, memory: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Cross-attention keys and values of the encoder ``memory`` (B, S, D), each (B, heads, S, d_head)."""
        assert self.cross is not None
        return self.cross.project("k", memory), self.cross.project("v", memory)

    def decode(
        self,
        x: np.ndarray,
        k_self: np.ndarray,
        v_self: np.ndarray,
        self_mask: np.ndarray | None,
        ck: np.ndarray,
        cv: np.ndarray,
        m: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A decoder layer on new positions ``x`` (B, Tn, D) after a cache of earlier keys/values; returns the
        output and the extended self-attention keys/values."""
        a, c = self.attn, self.cross
        assert c is not None
        h = layer_norm(x, *self.ln[0])
        k = np.concatenate([k_self, a.project("k", h)], axis=2)  # shape: (B, heads, t + Tn, d_head)
        v = np.concatenate([v_self, a.project("v", h)], axis=2)
        x = x + a.attend(a.project("q", h), k, v, self_mask)
        x = x + c.attend(c.project("q", layer_norm(x, *self.ln[1])), ck, cv, m[:, None, None, :])
        return self.feed_forward(x), k, v


class NumpyTransformer:
    """Inference-only numpy twin of :class:`beamkit.models.transformer.Transformer`, built from its
    ``state_dict``."""

    arch = "transformer"
    backend = "numpy"

    def __init__(
        self,
        src_vocab: Vocab,
        tgt_vocab: Vocab,
        params: Params,
        d_model: int = 64,
        heads: int = 4,
        ff: int = 128,
        enc_layers: int = 2,
        dec_layers: int = 2,
        max_len: int = 64,
        dropout: float = 0.0,
    ) -> None:
        """Take the weights from ``params`` (checked against these hyper-parameters, as the torch model's);
        ``dropout`` is recorded only (inference runs without it)."""
        self.config = transformer_config(d_model, heads, ff, enc_layers, dec_layers, max_len, dropout)
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
        self.d_model, self.heads, self.max_len = d_model, heads, max_len
        self.meta: dict[str, Any] = {}
        p = params.take
        self.src_emb = p("src_emb.weight", (len(src_vocab), d_model))
        self.tgt_emb = p("tgt_emb.weight", (len(tgt_vocab), d_model))
        self.src_pos = p("src_pos.weight", (max_len, d_model))
        self.tgt_pos = p("tgt_pos.weight", (max_len, d_model))
        self.enc = [_Block(params, f"enc.{i}", d_model, heads, ff, decoder=False) for i in range(enc_layers)]
        self.enc_ln = (p("enc_ln.weight", (d_model,)), p("enc_ln.bias", (d_model,)))
        self.dec = [_Block(params, f"dec.{i}", d_model, heads, ff, decoder=True) for i in range(dec_layers)]
        self.dec_ln = (p("dec_ln.weight", (d_model,)), p("dec_ln.bias", (d_model,)))
        self.out = (p("out.weight", (len(tgt_vocab), d_model)), p("out.bias", (len(tgt_vocab),)))
        params.check_all_used()

    def encode(self, src: Any, lengths: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """Encode padded ``src`` (B, S); return memory (B, S, D) and the source mask (B, S)."""
        src = np.asarray(src, dtype=np.int64)
        if src.shape[1] > self.max_len:
            raise ValueError(f"source of {src.shape[1]} tokens exceeds the model's max_len {self.max_len}")
        mask = src != self.src_vocab.pad  # shape: (B, S)
        x = self.src_emb[src] + self.src_pos[: src.shape[1]]  # shape: (B, S, D)
        for layer in self.enc:
            x = layer.encode(x, mask)
        return layer_norm(x, *self.enc_ln), mask

    def init_state(self, src: Any, lengths: Any = None) -> NumpyTransformerState:
        """Encode the requests (int arrays ``src`` (B, S), ``lengths`` (B,)) and return the step state: one row
        each, an empty self-attention cache, cross K/V computed once per request."""
        memory, mask = self.encode(src, lengths)
        kv_cross = [layer.cross_kv(memory) for layer in self.dec]
        ck, cv = tuple(k for k, _ in kv_cross), tuple(v for _, v in kv_cross)
        rows = memory.shape[0]
        empty = tuple(np.zeros((rows, self.heads, 0, self.d_model // self.heads), np.float32) for _ in self.dec)
        req = np.arange(rows, dtype=np.int64)
        return NumpyTransformerState(empty, empty, req, Shared((ck, cv, mask)))

    def step(self, state: NumpyTransformerState, y_prev: Any) -> tuple[np.ndarray, NumpyTransformerState]:
        """beamkit step function: feed only the newest token ``y_prev`` (rows,), return logits (rows, V)."""
        ck, cv, mask = state.cross.value
        r = state.req
        y = np.asarray(y_prev, dtype=np.int64)
        self_k, self_v, length = trim_self_cache(state, self.max_len)
        t = self_k[0].shape[2]  # cache columns = this token's position when every row holds all of them
        self_mask = None
        if length is None:
            x = self.tgt_emb[y][:, None, :] + self.tgt_pos[t]  # shape: (rows, 1, D)
        else:
            x = self.tgt_emb[y][:, None, :] + self.tgt_pos[length][:, None, :]
            cols = np.arange(t + 1)
            self_mask = (cols[None, :] >= (t - length)[:, None])[:, None, None, :]  # shape: (rows, 1, 1, t + 1)
        new_k, new_v = [], []
        for i, layer in enumerate(self.dec):
            x, k, v = layer.decode(x, self_k[i], self_v[i], self_mask, ck[i][r], cv[i][r], mask[r])
            new_k.append(k)
            new_v.append(v)
        logits = linear(layer_norm(x[:, 0], *self.dec_ln), *self.out)  # shape: (rows, V)
        new_length = None if length is None else length + 1
        return logits, NumpyTransformerState(tuple(new_k), tuple(new_v), r, state.cross, new_length)
