"""Benchmark: Hugging Face ``model.generate`` beam search vs ``beamkit.hf.generate`` on the same tiny models.

Tiny GPT-2 (2 layers, n_embd 64, vocab 1000, seed 0) and a T5-style model of the same size; 8 prompts of 10
tokens (left padding on some), num_beams 5, 40 new tokens, an eos that fires (a token the model likes, its
output row scaled so it wins in some contexts). The ``whisper`` preset is a tiny random
``WhisperForConditionalGeneration`` (2+2 layers, d_model 64, vocab 1000, 80 mel bins, 200 source positions,
seed 0) on input_features [8, 80, 400], language "en", task "transcribe", with the same kind of eos: Whisper's
model class has a generate of its own, so ``beamkit.hf.generate`` serves it with beamkit's decoding loop inside
Hugging Face's generate (``custom_generate``) rather than with the engine bridge. Three calls run in the same
process, in rotating order, after a warm-up run that checks sequences identical and sequences_scores within
1e-4: ``model.generate(...)``, ``beamkit.hf.generate(model, ...)`` and ``with beamkit.hf.patch(model):
model.generate(...)`` (the bridge for gpt2 / t5, the loop for whisper; a patch that falls back to Hugging
Face's own method stops the benchmark); every timed run checks the sequences again. One torch thread by
default (tiny models; ``--threads`` to change). Prints medians, then::

    hf-speedup[gpt2]: 1.62x; target >= 1.5x: met
    patched-speedup[gpt2]: 1.60x
    overhead[gpt2]: 7.5%

``overhead`` is the share of beamkit's end-to-end time spent outside the model's forward (and encoder) calls;
``host-per-step`` the same time per model call (the search, the cache reorder and the bridge's own work: what a
step adds over the forward, start-up included);
``hf-overhead`` is the same share for Hugging Face's ``generate`` (one extra run with its forward calls timed;
for whisper, whose loop output has no ``forward_seconds``, beamkit's share is measured the same way, its decoding
steps, which run the decoder's layers directly, counted as forward time).
``patched-speedup`` is the unpatched ``model.generate``'s time over the patched one's.
``--models marian,t5-small`` runs the encoder-decoder presets at real sizes. ``--ct2`` adds CTranslate2 (a
converted copy of the same model, float32, same thread count) for gpt2 and marian, compared under
``early_stopping=True`` (CTranslate2's stopping rule): ``ct2-vs-beamkit[gpt2]: 0.75x`` is CTranslate2's time
over beamkit's.
``--beams 1`` runs greedy decoding instead (``num_beams=1``: beamkit's greedy path, a dense cache; the sequences
are checked, Hugging Face returning no sequences_scores for greedy decoding).
``--compile [backend]`` adds a fourth timed call, ``beamkit.hf.generate(..., compile=backend)`` (inductor by
default), its graphs compiled in an untimed first call whose time is printed: ``compiled-speedup[whisper]`` is
beamkit's eager time over its compiled time, ``hf-speedup-compiled[whisper]`` Hugging Face's over the compiled
one; its outputs are counted against Hugging Face's (float32 rounding may move a near-tie), not required equal.
Run: ``HF_HUB_OFFLINE=1 .venv/bin/python bench/hf_vs_beamkit.py [--repeats 15] [--models gpt2,t5,whisper] [--ct2]
[--beams 5] [--compile [backend]]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

import beamkit.hf as bh  # noqa: E402
from beamkit.hf.bridge.generation import prepare  # noqa: E402

VOCAB, PROMPTS, PROMPT_LEN, BEAMS, NEW = 1000, 8, 10, 5, 40
# eos = the n-th most likely token after a few greedy steps, its output row scaled: picked so that eos fires
# for some requests early, for some late and for some not at all within 40 tokens (see the printed lengths)
EOS_PICK = {"gpt2": (0, 3.0), "t5": (2, 2.0), "whisper": (2, 1.4), "marian": (5, 1.0), "t5-small": (5, 1.0)}
# (random weights at these sizes give every prompt the same output; no eos pick found that fires at varied steps:
# with (5, 1.0) every hypothesis runs the full 40 tokens, the case with no finished request to drop)
# encoder-decoder presets at real sizes (random weights): Marian opus-mt (6+6 layers, 512 wide, 8 heads, FFN 2048,
# vocab 8000 here) and t5-small (6+6 layers, 512 wide, 8 heads of 64, FFN 2048, vocab 32128)
PRESET_VOCAB = {"marian": 8000, "t5-small": 32128}
TARGET = 1.5  # beamkit at least 1.5x Hugging Face's speed (hf-speedup), greedy and beam search


def marian(vocab: int) -> Any:
    """A random Marian opus-mt sized model (6+6 layers, 512 wide, 8 heads, FFN 2048) over ``vocab`` ids, pad last."""
    cfg = transformers.MarianConfig(
        vocab_size=vocab,
        decoder_vocab_size=vocab,
        d_model=512,
        encoder_layers=6,
        decoder_layers=6,
        encoder_attention_heads=8,
        decoder_attention_heads=8,
        encoder_ffn_dim=2048,
        decoder_ffn_dim=2048,
        max_position_embeddings=512,
        pad_token_id=vocab - 1,  # Marian's layout: pad is the last id and starts the decoder
        eos_token_id=1,
        decoder_start_token_id=vocab - 1,
        forced_eos_token_id=None,
    )
    model = transformers.MarianMTModel(cfg)
    model.generation_config.bad_words_ids = [[vocab - 1]]  # as opus-mt models: pad is never generated
    return model


def build(
    kind: str, layers: int = 2, width: int = 64, prompt_len: int = PROMPT_LEN
) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor, int, int]:
    """(model, input_ids, attention_mask, eos, pad) for ``kind`` in {"gpt2", "t5", "marian", "t5-small"}
    (``layers`` / ``width`` apply to the first two; the presets have their own sizes)."""
    torch.manual_seed(0)
    vocab = PRESET_VOCAB.get(kind, VOCAB)
    if kind == "marian":
        model = marian(vocab)
    elif kind == "t5-small":
        cfg = transformers.T5Config(
            num_layers=6,
            num_decoder_layers=6,
            d_model=512,
            d_ff=2048,
            d_kv=64,
            num_heads=8,
            vocab_size=vocab,
            pad_token_id=0,
            eos_token_id=1,
            decoder_start_token_id=0,
        )
        model = transformers.T5ForConditionalGeneration(cfg)
    elif kind == "gpt2":
        cfg = transformers.GPT2Config(
            n_layer=layers,
            n_embd=width,
            n_head=4,
            vocab_size=VOCAB,
            n_positions=prompt_len + NEW + 8,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.T5Config(
            num_layers=layers,
            num_decoder_layers=layers,
            d_model=width,
            d_ff=2 * width,
            d_kv=width // 4,
            num_heads=4,
            vocab_size=VOCAB,
            pad_token_id=0,
            eos_token_id=1,
            decoder_start_token_id=0,
        )
        model = transformers.T5ForConditionalGeneration(cfg)
    model.eval()
    pad = int(model.config.pad_token_id)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab - 1 if pad else vocab, (PROMPTS, prompt_len), generator=gen)
    mask = torch.ones_like(ids)
    for i in range(PROMPTS):  # left padding on some prompts
        ids[i, : i % 3] = pad
        mask[i, : i % 3] = 0
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=8,
            num_beams=1,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=pad,
            return_dict_in_generate=True,
            output_logits=True,
        )
        probs = torch.stack([lg.softmax(-1) for lg in out.logits]).mean(dim=(0, 1))
        probs[:2] = 0
        probs[pad] = 0
        rank, scale = EOS_PICK[kind]
        eos = int(probs.argsort(descending=True)[rank])
        model.get_output_embeddings().weight[eos] *= scale
    model.generation_config.eos_token_id = eos
    return model, ids, mask, eos, pad


def build_whisper() -> tuple[torch.nn.Module, torch.Tensor, int, int, dict[str, Any]]:
    """(model, input_features, eos, pad, Whisper's keywords) for the tiny random Whisper preset: its generation
    config filled in by hand (decoder start, language / task / no-timestamps tokens at the vocabulary's top)."""
    torch.manual_seed(0)
    top = VOCAB - 1
    cfg = transformers.WhisperConfig(
        vocab_size=VOCAB,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        num_mel_bins=80,
        max_source_positions=200,  # input_features of 400 frames (the real models: 1500, 3000 frames)
        max_target_positions=NEW + 8,
        init_std=0.1,  # at the default 0.02 every request decodes the same tokens
        pad_token_id=top,
        bos_token_id=top - 1,
        eos_token_id=top - 1,
        decoder_start_token_id=top - 2,
        suppress_tokens=None,
        begin_suppress_tokens=None,
    )
    model = transformers.WhisperForConditionalGeneration(cfg).eval()
    gc = model.generation_config
    gc.decoder_start_token_id = top - 2
    gc.pad_token_id = top
    gc.is_multilingual = True
    gc.lang_to_id = {"<|en|>": top - 9, "<|fr|>": top - 8}
    gc.task_to_id = {"transcribe": top - 7, "translate": top - 6}
    gc.no_timestamps_token_id = top - 5
    gc.max_length = None
    feats = torch.randn(PROMPTS, 80, 400, generator=torch.Generator().manual_seed(1))
    extra: dict[str, Any] = {"language": "en", "task": "transcribe"}
    with torch.no_grad():
        out = model.generate(
            feats,
            max_new_tokens=8,
            num_beams=1,
            do_sample=False,
            eos_token_id=None,
            return_dict_in_generate=True,
            output_logits=True,
            **extra,
        )
        probs = torch.stack([lg.softmax(-1) for lg in out.logits]).mean(dim=(0, 1))
        probs[top - 10 :] = 0  # no special token
        rank, scale = EOS_PICK["whisper"]
        eos = int(probs.argsort(descending=True)[rank])
        model.get_output_embeddings().weight[eos] *= scale
    gc.eos_token_id = eos
    return model, feats, eos, top, extra


def hf_overhead(model: torch.nn.Module, call: Any) -> float:
    """Share of one ``call()``'s time spent outside ``model``'s forward and its encoder's, and outside the direct
    decoding steps that run its layers without its forward (timed by wrappers)."""
    from beamkit.hf.steps.direct import DirectStep

    spent = [0.0]
    parts = [model] + ([model.get_encoder()] if getattr(model.config, "is_encoder_decoder", False) else [])

    def timed(forward: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = forward(*args, **kwargs)
            spent[0] += time.perf_counter() - start
            return out

        return wrapper

    for part in parts:
        part.forward = timed(part.forward)
    step = DirectStep.__call__
    DirectStep.__call__ = timed(step)  # type: ignore[method-assign]
    try:
        start = time.perf_counter()
        call()
        total = time.perf_counter() - start
    finally:
        for part in parts:
            del part.forward  # back to the class's forward
        DirectStep.__call__ = step  # type: ignore[method-assign]
    return 1.0 - spent[0] / total


def rotation(i: int, sides: tuple[str, ...]) -> tuple[str, ...]:
    """The order of run ``i``: ``sides`` rotated by ``i`` places, so each side runs first, second, ... equally
    often (none always on the warmest cache)."""
    k = i % len(sides)
    return sides[k:] + sides[:k]


def bk_scored(model: Any, ids: Any, mask: Any, kw: dict[str, Any], loop: bool) -> Any:
    """beamkit's output with sequences_scores: the engine bridge itself for the models it decodes
    (beamkit.hf.generate hands a call that asks for per-step scores to its loop, which keeps Hugging Face's
    tables), beamkit.hf.generate (its loop) for Whisper."""
    more = {"return_dict_in_generate": True, "output_scores": True}
    if loop:
        return bh.generate(model, ids, mask, **kw, **more)
    return prepare(model, ids, mask, {**kw, **more}, exact_only=False)()


def run(
    kind: str,
    repeats: int,
    layers: int = 2,
    width: int = 64,
    prompt_len: int = PROMPT_LEN,
    beams: int = BEAMS,
    compile_backend: str | None = None,
) -> tuple[float, float, float, float, float | None]:
    """Time the three calls; return (speedup, patched speedup, beamkit's overhead share, Hugging Face's, and
    with ``compile_backend`` the compiled call's speedup over beamkit's eager one, else None). ``beams`` 1: greedy
    decoding (Hugging Face returns no sequences_scores then: the sequences are compared)."""
    if kind == "whisper":
        model, ids, eos, pad, extra = build_whisper()
        mask = None
        inputs: dict[str, Any] = {}
    else:
        model, ids, mask, eos, pad = build(kind, layers, width, prompt_len)
        extra, inputs = {}, {"attention_mask": mask}
    beam_only = dict(early_stopping=False, length_penalty=1.0) if beams > 1 else {}
    kw = dict(
        num_beams=beams,
        max_new_tokens=NEW,
        **beam_only,
        eos_token_id=eos,
        pad_token_id=pad,
        **extra,
    )

    def hf_call(**more: Any) -> Any:
        return model.generate(ids, do_sample=False, **inputs, **kw, **more)

    def bk_call(**more: Any) -> Any:
        return bh.generate(model, ids, mask, **kw, **more)

    def patched_call() -> Any:
        with bh.patch(model) as handle:
            seq = model.generate(ids, do_sample=False, **inputs, **kw)
        if handle.fallbacks:
            raise SystemExit(f"[{kind}] the patch fell back to Hugging Face's own decoding: {handle.fallbacks}")
        return seq

    def compiled_call() -> Any:
        return bh.generate(model, ids, mask, compile=compile_backend, **kw)

    loop = kind == "whisper"  # served by beamkit's loop inside Hugging Face's generate: its own output object
    sides = ("hf", "bk", "patched") + (("compiled",) if compile_backend else ())
    times: dict[str, list[float]] = {side: [] for side in sides}
    agree = 0  # timed runs whose compiled rows all equal Hugging Face's (float32 rounding may move a near-tie)
    over: list[float] = []
    host: list[float] = []  # seconds a step spends outside the model's forward calls (beamkit, engine bridge)
    with torch.inference_mode():
        # warm-up, and the full check: sequences identical, sequences_scores within 1e-4
        hf = hf_call(return_dict_in_generate=True, output_scores=True)
        bk = bk_scored(model, ids, mask, kw, loop)
        if not torch.equal(hf.sequences, bk.sequences):
            raise SystemExit(f"[{kind}] outputs differ:\n{hf.sequences}\n{bk.sequences}")
        scored = getattr(hf, "sequences_scores", None) is not None  # beam search; greedy has none
        if scored and not torch.allclose(hf.sequences_scores, bk.sequences_scores, atol=1e-4, rtol=0):
            raise SystemExit(f"[{kind}] scores differ: {hf.sequences_scores} {bk.sequences_scores}")
        plain = hf_call()  # Whisper's plain output drops the decoder prompt, eos and padding; its dict keeps them
        if not torch.equal(patched_call(), plain):
            raise SystemExit(f"[{kind}] patched outputs differ")
        if compile_backend:  # compiled here, untimed (graphs are kept with the model)
            t0 = time.process_time()
            compiled_call()
            print(f"[{kind}] compile={compile_backend}: first call {time.process_time() - t0:.1f} s CPU")
        if loop:
            lengths = [int(n) for n in (plain != pad).sum(dim=1)]
            finished = sum(n < NEW for n in lengths)
        else:
            finished = sum(h.finished for hyps in bk.hypotheses for h in hyps)
            lengths = [len(hyps[0].tokens) for hyps in bk.hypotheses]
        for i in range(repeats):
            # timed: plain `model.generate(...)` (a LongTensor, as most callers use it) vs beamkit vs the patched
            # model.generate; the order rotates so no side always runs on a warmer cache
            got = {}
            for side in rotation(i, sides):
                t0 = time.perf_counter()
                if side == "hf":
                    got[side] = hf_call()
                elif side == "patched":
                    got[side] = patched_call()
                elif side == "compiled":
                    got[side] = compiled_call()
                elif loop:
                    got[side] = bk_call()
                else:
                    # the output object (for forward_seconds); building it costs well under 1% here
                    bk = bk_call(return_dict_in_generate=True)
                    got[side] = bk.sequences
                times[side].append(time.perf_counter() - t0)
                if side == "bk" and not loop:
                    over.append(1.0 - bk.forward_seconds / times[side][-1])
                    host.append((times[side][-1] - bk.forward_seconds) / max(1, bk.stats.model_calls))
            if not (torch.equal(got["hf"], got["bk"]) and torch.equal(got["hf"], got["patched"])):
                raise SystemExit(f"[{kind}] outputs differ in run {i}")
            if compile_backend:
                agree += int(torch.equal(got["hf"], got["compiled"]))
        hf_ov = hf_overhead(model, hf_call)
        if loop:
            over.append(hf_overhead(model, bk_call))
    hf_med, bk_med, pa_med = (statistics.median(times[side]) for side in ("hf", "bk", "patched"))
    ov = statistics.median(over)
    shape = (
        f"up to {NEW} new tokens"
        if loop
        else f"{bk.stats.model_calls} steps, rows/step {bk.stats.rows_total / bk.stats.model_calls:.1f}"
    )
    print(
        f"[{kind}] hf generate {hf_med * 1e3:.1f} ms, beamkit {bk_med * 1e3:.1f} ms, patched {pa_med * 1e3:.1f} ms "
        f"(median of {repeats}); {shape}, {finished} finished {'requests' if loop else 'hypotheses'}, "
        f"best lengths {lengths}; outputs identical"
    )
    if host:
        print(
            f"host-per-step[{kind}]: {statistics.median(host) * 1e3:.3f} ms a step outside the forward calls "
            f"(median of {repeats}; {shape})"
        )
    if not compile_backend:
        return hf_med / bk_med, hf_med / pa_med, ov, hf_ov, None
    co_med = statistics.median(times["compiled"])
    print(
        f"[{kind}] compiled ({compile_backend}) {co_med * 1e3:.1f} ms (median of {repeats}); its outputs equal "
        f"Hugging Face's in {agree}/{repeats} runs"
    )
    print(f"hf-speedup-compiled[{kind}]: {hf_med / co_med:.2f}x")
    return hf_med / bk_med, hf_med / pa_med, ov, hf_ov, bk_med / co_med


def ct2_ratio(kind: str, repeats: int, layers: int, width: int, prompt_len: int) -> float | None:
    """CTranslate2's time / beamkit's on a converted copy of the same model (float32, 1 thread), both stopping
    like ``early_stopping=True`` (CTranslate2's rule), beam 5, 40 new tokens, length penalty 1. Prints how many
    requests' best outputs agree (not required to: CTranslate2 is its own implementation). None when
    ``ctranslate2`` is not installed or the kind does not convert."""
    try:
        import ctranslate2
        import tokenizers
    except ImportError:
        print(f"[{kind}] ctranslate2 not installed (pip install ctranslate2): no ct2 column")
        return None
    model, ids, mask, eos, pad = build(kind, layers, width, prompt_len)
    vocab = int(model.config.vocab_size)
    names = [f"t{i}" for i in range(vocab)]
    if kind == "marian":  # CTranslate2's Marian loader drops a last "<pad>" (the decoder starts from zeros)
        names[pad] = "<pad>"
    words = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(names)}, unk_token="t3"))
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=words, pad_token=names[pad], eos_token=f"t{eos}", unk_token="t3", bos_token="t1"
    )
    prompts = [
        [f"t{t}" for t, m in zip(row, keep, strict=True) if m]
        for row, keep in zip(ids.tolist(), mask.tolist(), strict=True)
    ]
    kw = dict(
        num_beams=BEAMS, max_new_tokens=NEW, early_stopping=True, length_penalty=1.0, eos_token_id=eos, pad_token_id=pad
    )
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        ctranslate2.converters.TransformersConverter(tmp).convert(f"{tmp}/ct2", quantization="float32", force=True)
        opts = dict(device="cpu", compute_type="float32", inter_threads=1, intra_threads=torch.get_num_threads())
        if kind == "gpt2":
            gen = ctranslate2.Generator(f"{tmp}/ct2", **opts)

            def run_ct2() -> list[list[int]]:
                res = gen.generate_batch(
                    prompts, beam_size=BEAMS, max_length=NEW, include_prompt_in_result=False, end_token=f"t{eos}"
                )
                return [r.sequences_ids[0] for r in res]
        else:
            tr = ctranslate2.Translator(f"{tmp}/ct2", **opts)

            def run_ct2() -> list[list[int]]:
                res = tr.translate_batch(prompts, beam_size=BEAMS, max_decoding_length=NEW, end_token=f"t{eos}")
                return [[int(t[1:]) for t in r.hypotheses[0]] for r in res]

        t_ct2, t_bk = [], []
        with torch.inference_mode():
            bk = bh.generate(model, ids, mask, return_dict_in_generate=True, **kw)
            ours = [[t for t in hyps[0].tokens if t != eos] for hyps in bk.hypotheses]
            theirs = [[t for t in seq if t != eos] for seq in run_ct2()]
            for i in range(repeats):
                for side in ("ct2", "bk") if i % 2 == 0 else ("bk", "ct2"):
                    t0 = time.perf_counter()
                    if side == "ct2":
                        run_ct2()
                        t_ct2.append(time.perf_counter() - t0)
                    else:
                        bh.generate(model, ids, mask, **kw)
                        t_bk.append(time.perf_counter() - t0)
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    ct2_med, bk_med = statistics.median(t_ct2), statistics.median(t_bk)
    print(
        f"[{kind}] ctranslate2 {ctranslate2.__version__} {ct2_med * 1e3:.1f} ms, beamkit {bk_med * 1e3:.1f} ms "
        f"(early_stopping=True, median of {repeats}); best outputs agree on {same}/{len(ours)} requests"
    )
    return ct2_med / bk_med


def main() -> None:
    """Run the benchmark for the chosen models and print the summary lines."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--models", default="gpt2,t5,whisper", help="any of gpt2, t5, whisper, marian, t5-small (comma-separated)"
    )
    parser.add_argument("--layers", type=int, default=2, help="model size (the spec's figures use the defaults)")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=PROMPT_LEN)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: tiny models, shared box)")
    parser.add_argument("--ct2", action="store_true", help="add the CTranslate2 column (gpt2, marian)")
    parser.add_argument("--beams", type=int, default=BEAMS, help="num_beams (1: greedy decoding)")
    parser.add_argument(
        "--compile",
        nargs="?",
        const="inductor",
        default=None,
        help="add beamkit.hf.generate(..., compile=BACKEND) as a fourth timed call (default backend: inductor)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()  # Whisper's generate warns about the benchmark's own settings
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, threads {torch.get_num_threads()}")
    results = {
        kind: run(kind, args.repeats, args.layers, args.width, args.prompt_len, args.beams, args.compile)
        for kind in args.models.split(",")
    }
    for kind, (_, _, _, hf_ov, _) in results.items():
        print(f"hf-overhead[{kind}]: {hf_ov * 100:.1f}% (Hugging Face generate, for comparison)")
    for kind, (speed, patched, ov, _, compiled) in results.items():
        print(f"hf-speedup[{kind}]: {speed:.2f}x; target >= {TARGET}x: {'met' if speed >= TARGET else 'missed'}")
        print(f"patched-speedup[{kind}]: {patched:.2f}x")
        print(f"overhead[{kind}]: {ov * 100:.1f}%")
        if compiled is not None:
            print(f"compiled-speedup[{kind}]: {compiled:.2f}x (beamkit's eager time / its compiled time)")
    for kind in args.models.split(",") if args.ct2 else ():
        if kind in ("gpt2", "marian"):
            ratio = ct2_ratio(kind, args.repeats, args.layers, args.width, args.prompt_len)
            if ratio is not None:
                print(f"ct2-vs-beamkit[{kind}]: {ratio:.2f}x (CTranslate2's time / beamkit's)")


if __name__ == "__main__":
    main()
