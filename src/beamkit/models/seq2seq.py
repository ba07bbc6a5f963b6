"""An LSTM encoder-decoder with Luong (general) attention and input feeding, as a beamkit step function.

The encoder is a one-layer bidirectional LSTM; the decoder a stack of ``LSTMCell`` layers whose first input is
``[embedding(y_prev); feed]``, where ``feed`` is the previous attentional vector
``tanh(W_c [context; h_top])`` (Luong et al. 2015, input feeding). The decoder state is a :class:`DecoderState`
NamedTuple: per-layer ``h``/``c``, the feed vector and the request index of every row; the encoder memory is
per request and travels in a ``beamkit.Shared`` so that beams never copy it.

Requires torch (the ``torch`` extra).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from beamkit.models.common import join_lstm_states, seq2seq_config
from beamkit.models.vocab import Vocab
from beamkit.state import Shared


class DecoderState(NamedTuple):
    """The decoder state of :class:`Seq2Seq`; every tensor leaf has one row per live hypothesis."""

    h: tuple[Tensor, ...]  # per layer, shape: (rows, hidden)
    c: tuple[Tensor, ...]  # per layer, shape: (rows, hidden)
    feed: Tensor  # the previous attentional vector, shape: (rows, hidden)
    req: Tensor  # the request of each row, int64, shape: (rows,)
    memory: Any  # beamkit.Shared((enc_out (B, S, H), keys (B, S, H), mask (B, S) bool))

    def beamkit_concat(self, others: list[DecoderState]) -> DecoderState:
        """Join the rows of requests added to a running search (``beamkit.concat_state``): rows concatenated,
        the encoder memories of the requests still decoding joined (sources padded, masked), indices renumbered."""
        return DecoderState(*join_lstm_states([self, *others]))


class Seq2Seq(nn.Module):
    """LSTM encoder + LSTM decoder with Luong attention and input feeding over character vocabularies."""

    arch = "seq2seq"

    def __init__(self, src_vocab: Vocab, tgt_vocab: Vocab, emb: int = 32, hidden: int = 128, layers: int = 1) -> None:
        super().__init__()
        self.config = seq2seq_config(emb, hidden, layers)
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
        self.hidden, self.layers = hidden, layers
        self.src_emb = nn.Embedding(len(src_vocab), emb, padding_idx=src_vocab.pad)
        self.encoder = nn.LSTM(emb, hidden // 2, batch_first=True, bidirectional=True)
        self.bridge = nn.Linear(hidden, 2 * hidden * layers)  # final encoder state -> every layer's h0, c0
        self.tgt_emb = nn.Embedding(len(tgt_vocab), emb)
        self.cells = nn.ModuleList([nn.LSTMCell(emb + hidden if i == 0 else hidden, hidden) for i in range(layers)])
        self.attn = nn.Linear(hidden, hidden, bias=False)  # Luong "general": score = h_t . W_a h_s
        self.combine = nn.Linear(2 * hidden, hidden, bias=False)  # W_c
        self.out = nn.Linear(hidden, len(tgt_vocab))

    # ----------------------------------------------------------------------------------------- encoder
    def encode(self, src: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor, DecoderState]:
        """Encode padded ``src`` (B, S); return (enc_out, keys, mask, initial decoder parts with req)."""
        emb = self.src_emb(src)  # shape: (B, S, E)
        packed = nn.utils.rnn.pack_padded_sequence(emb, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, (h_n, _) = self.encoder(packed)
        enc_out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=src.shape[1])
        final = torch.cat([h_n[0], h_n[1]], dim=-1)  # shape: (B, H)
        hc = torch.tanh(self.bridge(final)).view(src.shape[0], 2, self.layers, self.hidden)
        h = tuple(hc[:, 0, i].contiguous() for i in range(self.layers))
        c = tuple(hc[:, 1, i].contiguous() for i in range(self.layers))
        keys = self.attn(enc_out)  # shape: (B, S, H), W_a h_s computed once per request
        mask = src != self.src_vocab.pad  # shape: (B, S)
        feed = enc_out.new_zeros(src.shape[0], self.hidden)
        req = torch.arange(src.shape[0], device=src.device)
        return enc_out, keys, mask, DecoderState(h, c, feed, req, None)

    # ----------------------------------------------------------------------------------------- decoder
    def _core(
        self,
        h: tuple[Tensor, ...],
        c: tuple[Tensor, ...],
        feed: Tensor,
        y_prev: Tensor,
        enc_out: Tensor,
        keys: Tensor,
        mask: Tensor,
    ) -> tuple[Tensor, tuple[Tensor, ...], tuple[Tensor, ...], Tensor]:
        """One decoder step over rows whose memory rows are already aligned; returns logits, h, c, feed."""
        x = torch.cat([self.tgt_emb(y_prev), feed], dim=-1)  # shape: (rows, E + H)
        new_h, new_c = [], []
        for layer, cell in enumerate(self.cells):
            hl, cl = cell(x, (h[layer], c[layer]))
            new_h.append(hl)
            new_c.append(cl)
            x = hl
        scores = torch.bmm(keys, x.unsqueeze(2)).squeeze(2)  # shape: (rows, S)
        scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        context = torch.bmm(weights.unsqueeze(1), enc_out).squeeze(1)  # shape: (rows, H)
        new_feed = torch.tanh(self.combine(torch.cat([context, x], dim=-1)))  # shape: (rows, H)
        logits = self.out(new_feed)  # shape: (rows, V)
        return logits, tuple(new_h), tuple(new_c), new_feed

    def forward(self, src: Tensor, lengths: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V) for decoder inputs ``tgt_in`` (B, T) starting with ``<bos>``."""
        enc_out, keys, mask, st = self.encode(src, lengths)
        h, c, feed = st.h, st.c, st.feed
        steps = []
        for t in range(tgt_in.shape[1]):
            logits, h, c, feed = self._core(h, c, feed, tgt_in[:, t], enc_out, keys, mask)
            steps.append(logits)
        return torch.stack(steps, dim=1)

    # ---------------------------------------------------------------------------- beamkit step function
    def init_state(self, src: Tensor, lengths: Tensor) -> DecoderState:
        """Return the decoder state for a batch of requests: one row per request, memory in ``Shared``."""
        enc_out, keys, mask, st = self.encode(src, lengths)
        return st._replace(memory=Shared((enc_out, keys, mask)))

    def step(self, state: DecoderState, y_prev: Any) -> tuple[Tensor, DecoderState]:
        """beamkit step function: logits (rows, V) for the rows of ``state`` after tokens ``y_prev`` (rows,)."""
        enc_out, keys, mask = state.memory.value
        y = torch.as_tensor(y_prev, dtype=torch.long, device=state.feed.device)
        r = state.req
        logits, h, c, feed = self._core(state.h, state.c, state.feed, y, enc_out[r], keys[r], mask[r])
        return logits, DecoderState(h, c, feed, r, state.memory)
