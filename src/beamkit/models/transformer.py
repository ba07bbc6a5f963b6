"""A small Transformer encoder-decoder with an incremental KV cache, as a beamkit step function.

Pre-LayerNorm blocks, learned positions. The step function feeds only the newest token: each decoder layer's
self-attention keys/values live in the state (``(rows, heads, t, d_head)``, gathered by beam with the rest),
while the cross-attention keys/values are computed once per *request* by :meth:`Transformer.init_state` and
travel in a ``beamkit.Shared``, indexed by the state's ``req`` leaf, so beams never copy them.

With ``init_state(..., kv=cache)`` (a :class:`beamkit.kv.PagedKVCache`, see :meth:`Transformer.paged_cache`)
the self-attention keys/values live in the cache's block pool instead: beams share the blocks of their common
prefix, the gather by parent copies block tables only, and attention reads a request's shared blocks once for
all its beams, in place (:mod:`beamkit.kv.attention`). A forced decoder ``prefix`` is fed teacher-forced
into the cache once per request.

Requires torch (the ``torch`` extra).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from beamkit.kv import PagedKVCache, PagedRows
from beamkit.models.common import join_cross, join_self_cache, transformer_config, trim_self_cache
from beamkit.models.compiled import MIN_ROWS, MIN_SOURCE, CompiledStep, StaticKV, bucket, compile_setting
from beamkit.models.vocab import Vocab
from beamkit.state import Shared


class TransformerState(NamedTuple):
    """Decoder state of :class:`Transformer`; tensor leaves have one row per live hypothesis."""

    self_k: tuple[Tensor, ...]  # per layer, shape: (rows, heads, t, d_head)
    self_v: tuple[Tensor, ...]  # per layer, shape: (rows, heads, t, d_head)
    req: Tensor  # request of each row, int64, shape: (rows,)
    cross: Any  # Shared((k per layer (B, heads, S, d_head), v per layer, src mask (B, S) bool))
    # positions each row holds, shape: (rows,), when rows of different lengths share the cache (requests that
    # joined a running search): each row's keys/values are right-aligned in the t columns, padding masked.
    # None: every row holds all t positions.
    length: Tensor | None = None
    # the self-attention cache in a PagedKVCache (self_k / self_v are then empty), or None for the dense cache
    paged: PagedRows | None = None
    # the compiled step's preallocated keys/values (self_k / self_v are then empty; cross sources padded)
    static: StaticKV | None = None

    def kv_bytes(self) -> int:
        """Bytes held by the self-attention cache: the paged pool's blocks in use, or the dense tensors."""
        if self.paged is not None:
            return self.paged.cache.bytes_in_use()
        if self.static is not None:
            return self.static.kv_bytes()
        return sum(int(x.numel()) * x.element_size() for x in (*self.self_k, *self.self_v))

    def beamkit_concat(self, others: list[TransformerState]) -> TransformerState:
        """Join the rows of requests added to a running search (``beamkit.concat_state``): self-attention caches
        left-padded to the longest (``length`` records each row's own), cross-attention keys/values of the
        requests still decoding joined (sources padded, masked), request indices renumbered."""
        parts = [self, *others]
        if any(p.static is not None for p in parts):
            raise ValueError(
                "requests cannot join a search running the compiled step (compile=True): start it with "
                "compile=False to add requests mid-flight"
            )
        if any((p.paged is None) != (self.paged is None) for p in parts):
            raise ValueError("cannot join paged and dense Transformer states: use one kind of cache for all")
        req, cross = join_cross(parts)
        if self.paged is not None:
            paged = self.paged.beamkit_concat([p.paged for p in others])  # type: ignore[misc]
            return TransformerState((), (), req, cross, None, paged)
        k, v, length = join_self_cache(parts)
        return TransformerState(k, v, req, cross, length)


class _Attention(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads, self.d_head = heads, d_model // heads
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.o = nn.Linear(d_model, d_model)

    def split(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B, heads, T, d_head)."""
        b, t, _ = x.shape
        return x.view(b, t, self.heads, self.d_head).transpose(1, 2)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """Scaled dot-product attention; ``mask`` broadcasts to (B, heads, Tq, Tk), True = may attend."""
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.d_head)  # shape: (B, heads, Tq, Tk)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v  # shape: (B, heads, Tq, d_head)
        b, _, t, _ = out.shape
        return self.o(out.transpose(1, 2).reshape(b, t, self.heads * self.d_head))


class _EncoderLayer(nn.Module):
    def __init__(self, d_model: int, heads: int, ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = _Attention(d_model, heads)
        self.ff = nn.Sequential(nn.Linear(d_model, ff), nn.ReLU(), nn.Linear(ff, d_model))

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        h = self.ln1(x)
        a = self.attn
        x = x + self.drop(a.attend(a.split(a.q(h)), a.split(a.k(h)), a.split(a.v(h)), mask[:, None, None, :]))
        return x + self.drop(self.ff(self.ln2(x)))


class _DecoderLayer(nn.Module):
    def __init__(self, d_model: int, heads: int, ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.ln1, self.ln2, self.ln3 = nn.LayerNorm(d_model), nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.self_attn = _Attention(d_model, heads)
        self.cross_attn = _Attention(d_model, heads)
        self.ff = nn.Sequential(nn.Linear(d_model, ff), nn.ReLU(), nn.Linear(ff, d_model))

    def cross_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-attention keys and values of the encoder ``memory`` (B, S, D), each (B, heads, S, d_head)."""
        a = self.cross_attn
        return a.split(a.k(memory)), a.split(a.v(memory))

    def forward(
        self, x: Tensor, k_self: Tensor, v_self: Tensor, self_mask: Tensor | None, ck: Tensor, cv: Tensor, m: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Run the layer on new positions ``x`` (B, Tn, D) after a cache of earlier keys/values.

        Returns the output and the extended self-attention keys/values.
        """
        a = self.self_attn
        h = self.ln1(x)
        k = torch.cat([k_self, a.split(a.k(h))], dim=2)  # shape: (B, heads, t + Tn, d_head)
        v = torch.cat([v_self, a.split(a.v(h))], dim=2)
        x = x + self.drop(a.attend(a.split(a.q(h)), k, v, self_mask))
        return self._cross_ff(x, ck, cv, m), k, v

    def forward_paged(self, x: Tensor, rows: PagedRows, layer: int, ck: Tensor, cv: Tensor, m: Tensor) -> Tensor:
        """Run the layer on the newest position ``x`` (rows, 1, D): its key/value is written into the paged
        cache ``rows`` (after :meth:`PagedRows.append`), attention reads the pages in place, each group of beams
        its shared prefix once (:meth:`PagedRows.attend`)."""
        a = self.self_attn
        h = self.ln1(x)
        rows.write(layer, a.split(a.k(h)), a.split(a.v(h)))
        out = rows.attend(layer, a.split(a.q(h)), 1.0 / math.sqrt(a.d_head))  # shape: (rows, heads, d_head)
        x = x + self.drop(a.o(out.reshape(x.shape[0], 1, a.heads * a.d_head)))
        return self._cross_ff(x, ck, cv, m)

    def _cross_ff(self, x: Tensor, ck: Tensor, cv: Tensor, m: Tensor) -> Tensor:
        """Cross-attention over the source, then the feed-forward block."""
        c = self.cross_attn
        x = x + self.drop(c.attend(c.split(c.q(self.ln2(x))), ck, cv, m[:, None, None, :]))
        return x + self.drop(self.ff(self.ln3(x)))


class Transformer(nn.Module):
    """A small pre-LN Transformer encoder-decoder over character vocabularies."""

    arch = "transformer"

    def __init__(
        self,
        src_vocab: Vocab,
        tgt_vocab: Vocab,
        d_model: int = 64,
        heads: int = 4,
        ff: int = 128,
        enc_layers: int = 2,
        dec_layers: int = 2,
        max_len: int = 64,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.config = transformer_config(d_model, heads, ff, enc_layers, dec_layers, max_len, dropout)
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
        self.d_model, self.heads, self.max_len = d_model, heads, max_len
        self.src_emb = nn.Embedding(len(src_vocab), d_model, padding_idx=src_vocab.pad)
        self.tgt_emb = nn.Embedding(len(tgt_vocab), d_model)
        self.src_pos = nn.Embedding(max_len, d_model)
        self.tgt_pos = nn.Embedding(max_len, d_model)
        self.enc = nn.ModuleList([_EncoderLayer(d_model, heads, ff, dropout) for _ in range(enc_layers)])
        self.enc_ln = nn.LayerNorm(d_model)
        self.dec = nn.ModuleList([_DecoderLayer(d_model, heads, ff, dropout) for _ in range(dec_layers)])
        self.dec_ln = nn.LayerNorm(d_model)
        self.out = nn.Linear(d_model, len(tgt_vocab))

    def encode(self, src: Tensor, lengths: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Encode padded ``src`` (B, S); return memory (B, S, D) and the source mask (B, S)."""
        if src.shape[1] > self.max_len:
            raise ValueError(f"source of {src.shape[1]} tokens exceeds the model's max_len {self.max_len}")
        mask = src != self.src_vocab.pad  # shape: (B, S)
        pos = torch.arange(src.shape[1], device=src.device)
        x = self.src_emb(src) + self.src_pos(pos)
        for layer in self.enc:
            x = layer(x, mask)
        return self.enc_ln(x), mask

    def _empty_cache(self, rows: int, like: Tensor) -> tuple[Tensor, ...]:
        d_head = self.d_model // self.heads
        return tuple(like.new_zeros(rows, self.heads, 0, d_head) for _ in self.dec)

    def forward(self, src: Tensor, lengths: Tensor | None, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V) for decoder inputs ``tgt_in`` (B, T), all positions at once."""
        memory, mask = self.encode(src, lengths)
        t = tgt_in.shape[1]
        if t > self.max_len:
            raise ValueError(f"target of {t} tokens exceeds the model's max_len {self.max_len}")
        pos = torch.arange(t, device=src.device)
        x = self.tgt_emb(tgt_in) + self.tgt_pos(pos)
        causal = torch.ones(t, t, dtype=torch.bool, device=src.device).tril()
        empty = self._empty_cache(src.shape[0], memory)
        for i, layer in enumerate(self.dec):
            assert isinstance(layer, _DecoderLayer)
            ck, cv = layer.cross_kv(memory)
            x, _, _ = layer(x, empty[i], empty[i], causal, ck, cv, mask)
        return self.out(self.dec_ln(x))

    # ---------------------------------------------------------------------------- beamkit step function
    def paged_cache(
        self, n_blocks: int, block_size: int = 16, device: str | torch.device | None = None
    ) -> PagedKVCache:
        """A :class:`beamkit.kv.PagedKVCache` shaped for this model's decoder (its layers, heads, head width and
        dtype), on ``device`` (default: the model's)."""
        w = self.out.weight
        d_head = self.d_model // self.heads
        dev = w.device if device is None else device
        return PagedKVCache(len(self.dec), self.heads, d_head, n_blocks, block_size, dtype=w.dtype, device=dev)

    def init_state(
        self,
        src: Tensor,
        lengths: Tensor | None = None,
        prefix: Tensor | None = None,
        kv: PagedKVCache | None = None,
        compile: bool | str = False,
    ) -> TransformerState:
        """Encode the requests and return the step state: one row each, cross K/V computed once per request.

        ``prefix`` (B, P): decoder inputs fed teacher-forced before the search (their keys/values are cached;
        the search's ``bos`` is then the input after them). ``kv``: keep the self-attention cache in this paged
        cache (shared by every request of one search) instead of dense per-row tensors. ``compile``: run the
        step through ``torch.compile`` (True: inductor; a string: that backend) over static shapes, keys/values
        in preallocated buffers (see :mod:`beamkit.models.compiled`); the default False is the eager step.
        Tokens match the eager step's; scores agree to float32 rounding (attention sums run over padded columns).
        """
        backend = compile_setting(compile)
        if backend is not None and kv is not None:
            raise ValueError("compile=True keeps its own key/value buffers: it cannot use a paged cache (kv=)")
        memory, mask = self.encode(src, lengths)
        kv_cross = [layer.cross_kv(memory) for layer in self.dec if isinstance(layer, _DecoderLayer)]
        ck, cv = tuple(k for k, _ in kv_cross), tuple(v for _, v in kv_cross)
        empty = self._empty_cache(src.shape[0], memory)
        keys, values = empty, empty
        if prefix is not None:
            keys, values = self._prefill(torch.as_tensor(prefix, device=src.device), ck, cv, mask)
        req = torch.arange(src.shape[0], device=src.device)
        if backend is not None:
            return self._static_state(keys, values, req, ck, cv, mask, backend)
        if kv is None:
            return TransformerState(keys, values, req, Shared((ck, cv, mask)))
        if not isinstance(kv, PagedKVCache):
            raise TypeError(f"kv must be a beamkit.kv.PagedKVCache or None, got {type(kv).__name__}")
        return TransformerState((), (), req, Shared((ck, cv, mask)), None, kv.prefill(keys, values))

    def _prefill(
        self, prefix: Tensor, ck: tuple[Tensor, ...], cv: tuple[Tensor, ...], mask: Tensor
    ) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
        """Self-attention keys/values of a teacher-forced decoder prefix (B, P), per layer (B, heads, P, d)."""
        if prefix.dim() != 2 or prefix.shape[0] != mask.shape[0]:
            raise ValueError(f"prefix must be [{mask.shape[0]}, P] token ids, got shape {tuple(prefix.shape)}")
        t = prefix.shape[1]
        if t >= self.max_len:
            raise ValueError(f"a prefix of {t} tokens leaves no room within the model's max_len {self.max_len}")
        pos = torch.arange(t, device=prefix.device)
        x = self.tgt_emb(prefix) + self.tgt_pos(pos)
        causal = torch.ones(t, t, dtype=torch.bool, device=prefix.device).tril()
        empty = self._empty_cache(prefix.shape[0], x)
        keys, values = [], []
        for i, layer in enumerate(self.dec):
            x, k, v = layer(x, empty[i], empty[i], causal, ck[i], cv[i], mask)
            keys.append(k)
            values.append(v)
        return tuple(keys), tuple(values)

    def step(self, state: TransformerState, y_prev: Any) -> tuple[Tensor, TransformerState]:
        """beamkit step function: feed only the newest token ``y_prev`` (rows,), return logits (rows, V)."""
        ck, cv, mask = state.cross.value
        r = state.req
        y = torch.as_tensor(y_prev, dtype=torch.long, device=r.device)
        if state.paged is not None:
            return self._step_paged(state, y)
        if state.static is not None:
            return self._step_static(state, y)
        self_k, self_v, length = trim_self_cache(state, self.max_len)
        t = self_k[0].shape[2]  # cache columns = this token's position when every row holds all of them
        if length is None:
            x = self.tgt_emb(y)[:, None, :] + self.tgt_pos.weight[t]  # shape: (rows, 1, D)
            self_mask = None
        else:
            x = self.tgt_emb(y)[:, None, :] + self.tgt_pos(length)[:, None, :]
            cols = torch.arange(t + 1, device=r.device)
            self_mask = (cols[None, :] >= (t - length)[:, None])[:, None, None, :]  # shape: (rows, 1, 1, t + 1)
        new_k, new_v = [], []
        for i, layer in enumerate(self.dec):
            x, k, v = layer(x, self_k[i], self_v[i], self_mask, ck[i][r], cv[i][r], mask[r])
            new_k.append(k)
            new_v.append(v)
        logits = self.out(self.dec_ln(x[:, 0]))  # shape: (rows, V)
        new_length = None if length is None else length + 1
        return logits, TransformerState(tuple(new_k), tuple(new_v), r, state.cross, new_length)

    def _step_paged(self, state: TransformerState, y: Tensor) -> tuple[Tensor, TransformerState]:
        """One step over the paged cache: one position appended per row (copy-on-write of shared partial
        blocks), attention read from the pages."""
        ck, cv, mask = state.cross.value
        r = state.req
        paged = state.paged
        assert paged is not None
        length = paged.length
        if len(paged) != r.shape[0]:
            raise ValueError(f"the paged cache holds {len(paged)} rows, the state {r.shape[0]}")
        if len(paged) and int(length.max()) >= self.max_len:
            raise ValueError(f"decoding past the model's max_len {self.max_len}")
        pos = torch.as_tensor(length, device=r.device)
        rows = paged.append()
        x = self.tgt_emb(y)[:, None, :] + self.tgt_pos(pos)[:, None, :]  # shape: (rows, 1, D)
        for i, layer in enumerate(self.dec):
            assert isinstance(layer, _DecoderLayer)
            x = layer.forward_paged(x, rows, i, ck[i][r], cv[i][r], mask[r])
        logits = self.out(self.dec_ln(x[:, 0]))  # shape: (rows, V)
        return logits, TransformerState((), (), r, state.cross, None, rows)

    # ---------------------------------------------------------------------------- the compiled step
    def compiled_step(self, backend: str) -> CompiledStep:
        """This model's static step compiled with ``backend`` (one per model and backend, its graphs per
        bucket kept for every later search)."""
        steps: dict[str, CompiledStep] = self.__dict__.setdefault("_compiled_steps", {})
        if backend not in steps:
            steps[backend] = CompiledStep(self._static_forward, backend, lambda: (*self.parameters(), *self.buffers()))
        return steps[backend]

    def _static_state(
        self,
        keys: tuple[Tensor, ...],
        values: tuple[Tensor, ...],
        req: Tensor,
        ck: tuple[Tensor, ...],
        cv: tuple[Tensor, ...],
        mask: Tensor,
        backend: str,
    ) -> TransformerState:
        """The compiled step's state: keys/values (of a prefix, if any) copied into buffers of ``max_len``
        columns, cross keys/values and the source mask padded to a source bucket."""
        rows, s = int(req.shape[0]), int(mask.shape[1])
        cap, sb = bucket(rows, MIN_ROWS), min(bucket(s, MIN_SOURCE), max(s, self.max_len))
        t = int(keys[0].shape[2])
        like = self.out.weight
        d_head = self.d_model // self.heads
        shape = (cap, self.heads, self.max_len, d_head)
        bufs = [like.new_zeros(shape) for _ in range(4 * len(self.dec))]
        layers = len(self.dec)
        for src, dst in zip((*keys, *values), bufs[: 2 * layers], strict=True):
            dst[:rows, :, :t].copy_(src)
        step = self.compiled_step(backend)
        static = StaticKV(bufs[:layers], bufs[layers : 2 * layers], bufs[2 * layers :], rows, t, step)
        grow = sb - s
        ck = tuple(torch.nn.functional.pad(k, (0, 0, 0, grow)) for k in ck)  # shape: (B, heads, sb, d_head)
        cv = tuple(torch.nn.functional.pad(v, (0, 0, 0, grow)) for v in cv)
        mask = torch.nn.functional.pad(mask, (0, grow), value=False)  # shape: (B, sb)
        return TransformerState((), (), req, Shared((ck, cv, mask)), None, None, static)

    def _static_forward(
        self,
        y: Tensor,
        pos: Tensor,
        keys: list[Tensor],
        values: list[Tensor],
        ck: list[Tensor],
        cv: list[Tensor],
        src_mask: Tensor,
    ) -> Tensor:
        """The one-token step over static shapes (what is compiled): ``y`` (cap,) tokens, ``pos`` (1,) their
        position; each layer's new key/value written into column ``pos`` of ``keys`` / ``values`` (cap, heads,
        max_len, d_head) in place, attention over every column with those past ``pos`` masked. Returns the
        logits (cap, V)."""
        x = self.tgt_emb(y)[:, None, :] + self.tgt_pos(pos)  # shape: (cap, 1, D)
        cols = torch.arange(keys[0].shape[2], device=y.device)
        self_mask = (cols <= pos)[None, None, None, :]  # shape: (1, 1, 1, max_len)
        for i, layer in enumerate(self.dec):
            assert isinstance(layer, _DecoderLayer)
            a = layer.self_attn
            h = layer.ln1(x)
            keys[i].index_copy_(2, pos, a.split(a.k(h)))  # shape: (cap, heads, 1, d_head) into column pos
            values[i].index_copy_(2, pos, a.split(a.v(h)))
            x = x + layer.drop(a.attend(a.split(a.q(h)), keys[i], values[i], self_mask))
            x = layer._cross_ff(x, ck[i], cv[i], src_mask)
        return self.out(self.dec_ln(x[:, 0]))  # shape: (cap, V)

    def _step_static(self, state: TransformerState, y: Tensor) -> tuple[Tensor, TransformerState]:
        """One step of the compiled step: rows padded to their bucket, the step run on buffer views."""
        static = state.static
        assert static is not None
        static.check()
        ck, cv, mask = state.cross.value
        r = state.req
        n, t = static.rows, static.t
        if n != r.shape[0]:
            raise ValueError(f"the compiled step's buffers hold {n} rows, the state {r.shape[0]}")
        if t >= self.max_len:
            raise ValueError(f"decoding past the model's max_len {self.max_len}")
        cap = bucket(n, MIN_ROWS)
        rows = torch.zeros(cap, dtype=torch.long, device=r.device)
        rows[:n] = r
        tokens = torch.zeros(cap, dtype=torch.long, device=r.device)
        tokens[:n] = y
        pos = torch.full((1,), t, dtype=torch.long, device=r.device)
        keys = [k[:cap] for k in static.keys]
        values = [v[:cap] for v in static.values]
        key = (cap, int(mask.shape[1]))
        logits = static.step(key, tokens, pos, keys, values, [k[rows] for k in ck], [v[rows] for v in cv], mask[rows])
        return logits[:n], TransformerState((), (), r, state.cross, None, None, static.advance())
