"""The LSTM encoder-decoder of :mod:`beamkit.models.seq2seq` in float32 numpy: inference only, same weights.

The same computation as the torch :class:`~beamkit.models.seq2seq.Seq2Seq` in eval mode: a bidirectional LSTM
encoder (each direction run over the true length of each source only, as ``pack_padded_sequence`` does), a
``tanh`` bridge to every decoder layer's ``h0``/``c0``, ``LSTMCell`` layers fed ``[embedding(y_prev); feed]``,
Luong "general" attention and input feeding. The decoder state is a :class:`NumpyDecoderState` with numpy
leaves (gathered by :func:`beamkit.select_state`), the encoder memory per request in a ``beamkit.Shared``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from beamkit.models.common import join_lstm_states, seq2seq_config
from beamkit.models.numpy_nn import Params, linear, lstm_cell, softmax
from beamkit.models.vocab import Vocab
from beamkit.state import Shared


class NumpyDecoderState(NamedTuple):
    """The decoder state of :class:`NumpySeq2Seq`; every array leaf has one row per live hypothesis."""

    h: tuple[np.ndarray, ...]  # per layer, float32, shape: (rows, hidden)
    c: tuple[np.ndarray, ...]  # per layer, float32, shape: (rows, hidden)
    feed: np.ndarray  # the previous attentional vector, float32, shape: (rows, hidden)
    req: np.ndarray  # the request of each row, int64, shape: (rows,)
    memory: Any  # beamkit.Shared((enc_out (B, S, H), keys (B, S, H), mask (B, S) bool))

    def beamkit_concat(self, others: list[NumpyDecoderState]) -> NumpyDecoderState:
        """Join the rows of requests added to a running search (``beamkit.concat_state``): rows concatenated,
        the encoder memories of the requests still decoding joined (sources padded, masked), indices renumbered."""
        return NumpyDecoderState(*join_lstm_states([self, *others]))


class NumpySeq2Seq:
    """Inference-only numpy twin of :class:`beamkit.models.seq2seq.Seq2Seq`, built from its ``state_dict``."""

    arch = "seq2seq"
    backend = "numpy"

    def __init__(
        self, src_vocab: Vocab, tgt_vocab: Vocab, params: Params, emb: int = 32, hidden: int = 128, layers: int = 1
    ) -> None:
        """Take the weights from ``params`` (checked against these hyper-parameters, as the torch model's)."""
        self.config = seq2seq_config(emb, hidden, layers)
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
        self.hidden, self.layers = hidden, layers
        self.meta: dict[str, Any] = {}
        half, sv, tv = hidden // 2, len(src_vocab), len(tgt_vocab)
        p = params.take
        self.src_emb = p("src_emb.weight", (sv, emb))
        self.enc = {
            suffix: (
                p(f"encoder.weight_ih_l0{suffix}", (4 * half, emb)),
                p(f"encoder.weight_hh_l0{suffix}", (4 * half, half)),
                p(f"encoder.bias_ih_l0{suffix}", (4 * half,)),
                p(f"encoder.bias_hh_l0{suffix}", (4 * half,)),
            )
            for suffix in ("", "_reverse")
        }
        self.bridge = (p("bridge.weight", (2 * hidden * layers, hidden)), p("bridge.bias", (2 * hidden * layers,)))
        self.tgt_emb = p("tgt_emb.weight", (tv, emb))
        self.cells = [
            (
                p(f"cells.{i}.weight_ih", (4 * hidden, emb + hidden if i == 0 else hidden)),
                p(f"cells.{i}.weight_hh", (4 * hidden, hidden)),
                p(f"cells.{i}.bias_ih", (4 * hidden,)),
                p(f"cells.{i}.bias_hh", (4 * hidden,)),
            )
            for i in range(layers)
        ]
        self.attn = p("attn.weight", (hidden, hidden))
        self.combine = p("combine.weight", (hidden, 2 * hidden))
        self.out = (p("out.weight", (tv, hidden)), p("out.bias", (tv,)))
        params.check_all_used()

    # ----------------------------------------------------------------------------------------- encoder
    def _direction(self, emb: np.ndarray, lengths: np.ndarray, reverse: bool) -> tuple[np.ndarray, np.ndarray]:
        """One encoder direction over the true lengths; outputs (B, S, H/2) (zero past each length), last h."""
        w_ih, w_hh, b_ih, b_hh = self.enc["_reverse" if reverse else ""]
        b, s, _ = emb.shape
        half = self.hidden // 2
        h = np.zeros((b, half), dtype=np.float32)
        c = np.zeros((b, half), dtype=np.float32)
        out = np.zeros((b, s, half), dtype=np.float32)  # shape: (B, S, H/2)
        for t in reversed(range(s)) if reverse else range(s):
            live = (t < lengths)[:, None]  # shape: (B, 1); the reverse pass starts at each source's last token
            h_t, c_t = lstm_cell(emb[:, t], h, c, w_ih, w_hh, b_ih, b_hh)
            h, c = np.where(live, h_t, h), np.where(live, c_t, c)
            out[:, t] = np.where(live, h_t, 0.0)
        return out, h

    def encode(self, src: Any, lengths: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, NumpyDecoderState]:
        """Encode padded ``src`` (B, S); return (enc_out, keys, mask, initial decoder parts with req)."""
        src = np.asarray(src, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        emb = self.src_emb[src]  # shape: (B, S, E)
        fwd, h_fwd = self._direction(emb, lengths, reverse=False)
        bwd, h_bwd = self._direction(emb, lengths, reverse=True)
        enc_out = np.concatenate([fwd, bwd], axis=-1)  # shape: (B, S, H)
        final = np.concatenate([h_fwd, h_bwd], axis=-1)  # shape: (B, H)
        hc = np.tanh(linear(final, *self.bridge)).reshape(src.shape[0], 2, self.layers, self.hidden)
        h = tuple(np.ascontiguousarray(hc[:, 0, i]) for i in range(self.layers))
        c = tuple(np.ascontiguousarray(hc[:, 1, i]) for i in range(self.layers))
        keys = linear(enc_out, self.attn)  # shape: (B, S, H), W_a h_s computed once per request
        mask = src != self.src_vocab.pad  # shape: (B, S)
        feed = np.zeros((src.shape[0], self.hidden), dtype=np.float32)
        req = np.arange(src.shape[0], dtype=np.int64)
        return enc_out, keys, mask, NumpyDecoderState(h, c, feed, req, None)

    # ---------------------------------------------------------------------------- beamkit step function
    def init_state(self, src: Any, lengths: Any) -> NumpyDecoderState:
        """Return the decoder state for a batch of requests (int arrays ``src`` (B, S), ``lengths`` (B,)): one
        row per request, the encoder memory in ``Shared``."""
        enc_out, keys, mask, st = self.encode(src, lengths)
        return st._replace(memory=Shared((enc_out, keys, mask)))

    def step(self, state: NumpyDecoderState, y_prev: Any) -> tuple[np.ndarray, NumpyDecoderState]:
        """beamkit step function: logits (rows, V) for the rows of ``state`` after tokens ``y_prev`` (rows,)."""
        enc_out, keys, mask = state.memory.value
        y = np.asarray(y_prev, dtype=np.int64)
        r = state.req
        x = np.concatenate([self.tgt_emb[y], state.feed], axis=-1)  # shape: (rows, E + H)
        new_h, new_c = [], []
        for layer, cell in enumerate(self.cells):
            x, cl = lstm_cell(x, state.h[layer], state.c[layer], *cell)
            new_h.append(x)
            new_c.append(cl)
        scores = np.matmul(keys[r], x[:, :, None])[:, :, 0]  # shape: (rows, S)
        scores = np.where(mask[r], scores, np.float32(-np.inf))
        weights = softmax(scores)  # shape: (rows, S)
        context = np.matmul(weights[:, None, :], enc_out[r])[:, 0]  # shape: (rows, H)
        feed = np.tanh(linear(np.concatenate([context, x], axis=-1), self.combine))  # shape: (rows, H)
        logits = linear(feed, *self.out)  # shape: (rows, V)
        return logits, NumpyDecoderState(tuple(new_h), tuple(new_c), feed, r, state.memory)
